"""Collate: ragged examples -> padded x, y, loss_mask, attention_mask.

Pure numpy: one fancy-index gather per batch from the flat token buffer, no loop per token or
per example. Variants sit in `COLLATE_FNS`; the Parquet dataset and the episode loader share them.
Packed rows (`etl.ragged.PackedBatch`) have their own fixed-shape collate next to these:
`etl.loader.collate_packed.PACKED_COLLATE_FNS` (same x, y, loss_mask, plus document arrays).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

import numpy as np

from etl.columns import CUT_SIDES, IGNORE_INDEX, IMAGE_GRID_THW, check_seq_len
from etl.errors import EtlError
from etl.ragged import Ragged, from_examples

# The image arrays of a batch of image data, as transformers' Qwen2-VL processor names them
# (`etl.loader.images` makes them; `etl.train.hf` passes them on).
PIXEL_VALUES = "pixel_values"
IMAGE_KEYS = (PIXEL_VALUES, IMAGE_GRID_THW)

# The side of an over-long example that is cut (the values of `CUT_SIDES`): "right" keeps the
# first tokens, "left" the last. Not the run's turn policies (the config's `truncation.policy`).
CutSide = Literal["right", "left"]


class _CollateFn(Protocol):
    """Signature shared by every entry of `COLLATE_FNS`."""

    def __call__(
        self,
        batch: Ragged,
        *,
        seq_len: int,
        pad_id: int,
        pad_multiple: int = 1,
        use_loss_mask: bool = True,
        mask_dtype: Any = np.bool_,
        ignore_index: int | None = IGNORE_INDEX,
        truncation: CutSide = "right",
    ) -> dict[str, np.ndarray]: ...


def resolve_pad_id(pad_id: int | None, manifest: Mapping[str, Any] | None) -> int:
    """Pick the pad id: explicit argument, else manifest ``pad_id``, else manifest ``eot_id``.

    Raises:
        EtlError: when none of the three gives an integer.
    """
    if pad_id is not None:
        return int(pad_id)
    for key in ("pad_id", "eot_id"):
        value = (manifest or {}).get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise EtlError(
        "no pad id: the manifest has neither `pad_id` nor `eot_id`; pass pad_id=<token id> "
        "(usually the template's end-of-turn id)"
    )


def resolve_eos_id(eos_id: int | None, manifest: Mapping[str, Any] | None) -> int | None:
    """The id ``train_on_eos=False`` masks: explicit, else the manifest's last ``eos_ids``
    (the template's end of sequence), else its ``eot_id``; None when the manifest has neither."""
    if eos_id is not None:
        return int(eos_id)
    eos = (manifest or {}).get("eos_ids") or []
    value = eos[-1] if eos else (manifest or {}).get("eot_id")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _gather_padded(
    batch: Ragged, *, width: int, pad_id: int, truncation: CutSide = "right"
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Pad or truncate every example to ``width`` tokens with one vectorized gather.

    Args:
        batch: the examples.
        width: tokens per row of the result (S = T + 1).
        pad_id: id written after the end of shorter examples.
        truncation: ``"right"`` keeps the first ``width`` tokens (``t[:L]``, as the episode
            loader cuts); ``"left"`` keeps the last ``width`` (the final end-of-turn survives).

    Returns:
        ``(tokens (B, width) int64, valid (B, width) bool, mask (B, width) bool | None,
        weight (B, width) float32 | None)``; mask and weight are 0 on padding.
    """
    check_seq_len(width)
    if truncation not in CUT_SIDES:
        raise EtlError(f"truncation must be 'right' or 'left', got {truncation!r}")
    lengths = batch.lengths.astype(np.int64, copy=False)
    kept = np.minimum(lengths, width)
    first = batch.starts + (lengths - kept if truncation == "left" else 0)
    col = np.arange(width, dtype=np.int64)
    valid = col[None, :] < kept[:, None]
    # Padding positions read index 0 and are overwritten: cheaper than a masked gather.
    src = np.where(valid, first[:, None] + col[None, :], 0)
    tokens = _gather(batch.ids, src, valid, pad_id, np.int64)
    mask = None if batch.mask is None else _gather(batch.mask, src, valid, 0, np.bool_)
    weight = None if batch.weight is None else _gather(batch.weight, src, valid, 0, np.float32)
    return tokens, valid, mask, weight


def _gather(
    flat: np.ndarray, src: np.ndarray, valid: np.ndarray, fill: int, dtype: Any
) -> np.ndarray:
    """``flat[src]`` where valid, else ``fill``; an all-empty batch has nothing to index."""
    if flat.size == 0:
        return np.full(src.shape, fill, dtype=dtype)
    values = flat[src]
    if dtype is np.bool_:
        values = values != 0  # masks may be stored as uint8 or float32 (the episode layout)
    return np.where(valid, values, fill).astype(dtype, copy=False)


def _shift(
    tokens: np.ndarray,
    valid: np.ndarray,
    mask: np.ndarray | None,
    weight: np.ndarray | None,
    *,
    use_loss_mask: bool,
    mask_dtype: Any,
    ignore_index: int | None,
) -> dict[str, np.ndarray]:
    """x = t[:-1], y = t[1:]; everything about y is read at position i + 1 of the example."""
    if use_loss_mask and mask is None:
        raise EtlError(
            "the data has no loss mask; pass use_loss_mask=False to train on every token"
        )
    trained = valid[:, 1:].copy()
    if use_loss_mask:
        trained &= mask[:, 1:]  # type: ignore[index]
    y = tokens[:, 1:].copy()  # never a view: x shares `tokens` and y is written below
    if ignore_index is not None:
        y[~trained] = ignore_index
    out = {
        "x": np.ascontiguousarray(tokens[:, :-1]),
        "y": y,
        "loss_mask": trained.astype(mask_dtype, copy=False),
        "attention_mask": np.ascontiguousarray(valid[:, :-1]),
    }
    if weight is not None:
        out["loss_weight"] = np.where(trained, weight[:, 1:], 0).astype(np.float32, copy=False)
    return out


def collate_fixed(
    batch: Ragged,
    *,
    seq_len: int,
    pad_id: int,
    pad_multiple: int = 1,
    use_loss_mask: bool = True,
    mask_dtype: Any = np.bool_,
    ignore_index: int | None = IGNORE_INDEX,
    truncation: CutSide = "right",
) -> dict[str, np.ndarray]:
    """Every batch is (B, T), T = seq_len - 1: fixed shapes, no recompiles or allocator churn.

    Trade-off: short examples pay for padding up to T (compute and memory); pick `collate_longest`
    when lengths vary a lot and the model tolerates changing shapes.

    Args:
        batch: the examples.
        seq_len: S = T + 1 tokens per example before the shift.
        pad_id: id used after shorter examples (never trained).
        pad_multiple: ignored here (kept for a common signature).
        use_loss_mask: False trains every real token (as in pretraining); padding
            is never trained.
        mask_dtype: dtype of ``loss_mask``: bool, or np.float32 (the episode loader).
        ignore_index: value of ``y`` where not trained; None keeps the raw ids (the episode
            loader's y).
        truncation: which end of a too-long example survives, see `_gather_padded`.

    Returns:
        ``x``, ``y`` (B, T) int64, ``loss_mask`` (B, T) aligned to y
        (``loss_mask[:, i] = mask[i + 1]``), ``attention_mask`` (B, T) bool over x, and
        ``loss_weight`` (B, T) float32 when the data has per-token weights.
    """
    del pad_multiple
    tokens, valid, mask, weight = _gather_padded(
        batch, width=seq_len, pad_id=pad_id, truncation=truncation
    )
    return _shift(
        tokens,
        valid,
        mask,
        weight,
        use_loss_mask=use_loss_mask,
        mask_dtype=mask_dtype,
        ignore_index=ignore_index,
    )


def collate_longest(
    batch: Ragged,
    *,
    seq_len: int,
    pad_id: int,
    pad_multiple: int = 1,
    use_loss_mask: bool = True,
    mask_dtype: Any = np.bool_,
    ignore_index: int | None = IGNORE_INDEX,
    truncation: CutSide = "right",
) -> dict[str, np.ndarray]:
    """Pad only to the longest example (T = its length - 1, capped at seq_len - 1), as TRL's
    ``DataCollatorForLanguageModeling`` pads; ``pad_multiple`` > 1 rounds T up to a multiple of
    it (TRL's ``pad_to_multiple_of``, e.g. 8 for tensor cores).

    Trade-off: far less padding on short chats (T0 median ~120 tokens vs T = 2047), but shapes
    that vary by batch (up to seq_len / pad_multiple distinct ones), which compiled models and
    the CUDA caching allocator pay for: a larger ``pad_multiple`` buckets them. Arguments and
    result as in `collate_fixed`.
    """
    if pad_multiple < 1:
        raise EtlError(f"pad_multiple must be >= 1, got {pad_multiple}")
    longest = int(batch.lengths.max(initial=0))
    t = -(-max(longest - 1, 1) // pad_multiple) * pad_multiple
    return collate_fixed(
        batch,
        seq_len=min(t, seq_len - 1) + 1,
        pad_id=pad_id,
        use_loss_mask=use_loss_mask,
        mask_dtype=mask_dtype,
        ignore_index=ignore_index,
        truncation=truncation,
    )


COLLATE_FNS: dict[str, _CollateFn] = {"fixed": collate_fixed, "longest": collate_longest}


def collate(
    batch: Ragged | Sequence[Mapping[str, np.ndarray]],
    *,
    strategy: str = "fixed",
    **options: Any,
) -> dict[str, np.ndarray]:
    """Collate a `Ragged` batch or a list of ``dataset[i]`` dicts with a named strategy.

    Args:
        batch: a `Ragged` (from ``dataset.__getitems__``) or per-example dicts.
        strategy: a key of `COLLATE_FNS` (``"fixed"`` or ``"longest"``).
        **options: keyword arguments of that function (``seq_len``, ``pad_id``, ...).

    Returns:
        The dict of numpy arrays described in `collate_fixed`; dicts of image data (their
        ``pixel_values``, ``image_grid_thw``) add those arrays, joined in order.
    """
    try:
        fn = COLLATE_FNS[strategy]
    except KeyError:
        raise EtlError(
            f"unknown collate strategy {strategy!r}; choose one of {sorted(COLLATE_FNS)}"
        ) from None
    if isinstance(batch, Ragged):
        return fn(batch, **options)
    images = {k: np.concatenate([e[k] for e in batch]) for k in IMAGE_KEYS if batch and k in batch[0]}
    return fn(from_examples(batch), **options) | images
