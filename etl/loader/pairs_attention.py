"""Attention for prefix-shared packed pairs (`etl.loader.pairs_pack`), and the transformers call.

Rule: a token attends causally inside its own pair only, and a rejected token never to a
chosen one; so chosen sees [prompt, itself], rejected sees [prompt, itself], exactly the keys
it has in TRL's padded rows (prompt + completion). Positions (``position_ids``, rejected
restarting at P) make the relative distances equal too, so RoPE models compute the same
values. Padding (pair 0) attends to earlier padding, so no query row is fully masked (a NaN
softmax). A sliding window, where the model has one, is measured in positions (= the columns of
the padded row), not in columns of the packed row.

Two forms of one rule, as `etl.loader.attention`: `pair_block_mask` (FlexAttention,
block-sparse, for the GPU) and `pair_sdpa_mask` (dense (B, 1, S, S) booleans: S^2 bytes a row,
4 MB at S = 2048; CPU, tests, moderate S). torch is imported here, never by the collate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from etl.columns import COMPLETION_MASK, INPUT_IDS
from etl.errors import EtlError
from etl.loader.hf_kwargs import _device_dtype, _implementation
from etl.loader.pairs_pack import PAIR_IDS, PART_CHOSEN, PART_IDS, PART_REJECTED

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_FULL, _SLIDING = "full_attention", "sliding_attention"


def pair_mask_mod(
    pair_ids: torch.Tensor, part_ids: torch.Tensor, *, position_ids: torch.Tensor | None = None,
    window: int | None = None,
) -> MaskMod:
    """FlexAttention ``mask_mod(b, h, q, kv)``: same pair, kv <= q, not (rejected q, chosen kv),
    and with ``window``, ``position_ids[q] - position_ids[kv] < window``.

    Args:
        pair_ids, part_ids: (B, S) integer tensors of the packed batch.
        position_ids: (B, S) positions; needed with ``window``.
        window: a sliding window in tokens (transformers' ``sliding_window``), None: none.
    """
    if pair_ids.dim() != 2 or pair_ids.shape != part_ids.shape:
        raise EtlError(f"pair_ids and part_ids must be (B, S) tensors of one shape (the packed pair batch's), "
                       f"got {tuple(pair_ids.shape)} and {tuple(part_ids.shape)}")
    if window is not None and position_ids is None:
        raise EtlError("a sliding window is measured in positions: pass position_ids")

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        same = (pair_ids[b, q] == pair_ids[b, kv]) & (kv <= q)
        crossed = (part_ids[b, q] == PART_REJECTED) & (part_ids[b, kv] == PART_CHOSEN)
        keep = same & ~crossed
        if window is not None:
            keep = keep & (position_ids[b, q] - position_ids[b, kv] < window)  # type: ignore[index]
        return keep

    return mask_mod


def pair_block_mask(
    pair_ids: torch.Tensor, part_ids: torch.Tensor, *, position_ids: torch.Tensor | None = None,
    window: int | None = None, block_size: int = 128,
) -> BlockMask:
    """FlexAttention `BlockMask` of `pair_mask_mod`, H broadcast.

    Trade-off: built once per batch on the batch's device (evaluates the mask over B x S x S
    there), then skips every block between pairs; FlexAttention's backward needs CUDA.
    """
    mod = pair_mask_mod(pair_ids, part_ids, position_ids=position_ids, window=window)
    num_rows, width = pair_ids.shape
    return create_block_mask(mod, B=num_rows, H=None, Q_LEN=width, KV_LEN=width, device=pair_ids.device,
                             BLOCK_SIZE=block_size)


def pair_sdpa_mask(
    pair_ids: torch.Tensor, part_ids: torch.Tensor, *, position_ids: torch.Tensor | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Boolean (B, 1, S, S) mask of `pair_mask_mod` for ``scaled_dot_product_attention``
    (True = may attend), computed by broadcasting (no Python loop).

    Trade-off: dense, B x S^2 bytes (128 MB at B = 32, S = 2048) and no skipped work.
    """
    mod = pair_mask_mod(pair_ids, part_ids, position_ids=position_ids, window=window)
    num_rows, width = pair_ids.shape
    b = torch.arange(num_rows, device=pair_ids.device)[:, None, None, None]
    q = torch.arange(width, device=pair_ids.device)[None, None, :, None]
    return mod(b, torch.zeros_like(b), q, q.transpose(2, 3))


def _window_layers(config: Any) -> dict[str, int | None]:
    """Layer type -> its window: full layers None; raises on layer types it cannot mask."""
    types = set(getattr(config, "layer_types", None) or [_FULL])
    window = getattr(config, "sliding_window", None)
    if getattr(config, "attention_chunk_size", None) or types - {_FULL, _SLIDING}:
        raise EtlError(f"prefix-shared packing masks full and sliding-window layers, not {sorted(types)} "
                       "(chunked attention): use padded preference batches (packing=None)")
    if _SLIDING in types and not window:
        raise EtlError("the model has sliding_attention layers but no config.sliding_window")
    return {t: window if t == _SLIDING else None for t in types}


def pair_hf_inputs(batch: Mapping[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """Keywords for ``model(**kw)`` of a transformers causal LM, for either preference layout.

    - padded (`collate_pairs`): ``input_ids`` and the 2D ``attention_mask``, as TRL calls it.
    - packed (`collate_pairs_packed`): ``input_ids``, ``position_ids`` and a custom mask per the
      model's ``config._attn_implementation``: ``sdpa`` a boolean (B, 1, S, S) mask; ``eager``
      the same, additive (0 or the dtype's minimum); ``flex_attention`` a `BlockMask` (CUDA for
      the backward: on CPU train with ``sdpa``, same result). A model with sliding-window
      layers gets ``{layer type: mask}`` (transformers takes a dict) with the window in positions.
      flash-attn's varlen kernels cannot skip the chosen tokens for the rejected ones:
      load the model with ``sdpa`` or ``flex_attention``.

    Both add ``use_cache=False`` and no labels: score the logits with
    `etl.loader.pairs_logps.completion_logps`.

    Raises:
        EtlError: a batch of neither layout, or an implementation the layout cannot use.
    """
    config, impl = _implementation(model)
    device, dtype = _device_dtype(model)
    ids = torch.as_tensor(batch[INPUT_IDS]).long().to(device, non_blocking=True)
    if PAIR_IDS not in batch:
        if "attention_mask" not in batch or COMPLETION_MASK not in batch:
            raise EtlError(f"pair_hf_inputs needs a preference batch (collate_pairs or collate_pairs_packed); "
                           f"this one has {sorted(batch)}")
        return {INPUT_IDS: ids, "attention_mask": torch.as_tensor(batch["attention_mask"]).to(device),
                "use_cache": False}
    if impl not in ("sdpa", "eager", "flex_attention"):
        raise EtlError(f"prefix-shared packed pairs need a custom attention mask; {impl} takes none: load the "
                       "model with attn_implementation='sdpa' (or 'flex_attention' on CUDA), or use padded "
                       "preference batches (packing=None)")
    pair, part, pos = (torch.as_tensor(batch[k]).to(device, non_blocking=True)
                       for k in (PAIR_IDS, PART_IDS, "position_ids"))
    pos = pos.long()
    masks = {}
    for layer_type, window in _window_layers(config).items():
        if impl == "flex_attention":
            masks[layer_type] = pair_block_mask(pair, part, position_ids=pos, window=window)
            continue
        mask = pair_sdpa_mask(pair, part, position_ids=pos, window=window)
        if impl == "eager":  # eager adds the mask to the scores
            mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, torch.finfo(dtype).min)
        masks[layer_type] = mask
    attention = masks[_FULL] if list(masks) == [_FULL] else masks
    return {INPUT_IDS: ids, "position_ids": pos, "attention_mask": attention, "use_cache": False}
