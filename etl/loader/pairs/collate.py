"""Padded preference batches, TRL's layout: chosen rows, then rejected rows, right-padded.

`collate_pairs` gives for B pairs what TRL 1.16's ``DataCollatorForPreference`` gives for the
same rows (``input_ids``, ``attention_mask``, ``completion_mask``, all (2B, L) int64), with one
gather from the batch's joined tokens instead of TRL's per-row Python lists; etl's
``completion_mask`` is also 0 on completion tokens the data leaves untrained (``chosen_mask`` /
``rejected_mask`` False: a tool result inside a multi-turn completion), where TRL's is 1.
Unpaired (KTO) rows collate as SFT rows (`etl.loader.collate`) plus their ``label``.
Pure numpy, like `etl.loader.collate`; the prefix-shared packed layout is `etl.loader.pairs.pack`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from etl.columns import COMPLETION_MASK, INPUT_IDS, LABEL
from etl.errors import EtlError
from etl.kinds import PREFERENCE, UNPAIRED
from etl.loader.collate import collate
from etl.loader.pairs.rows import PairRows, rows_from_examples
from etl.ragged import concat

# TRL's names for which end of a sequence longer than max_length survives.
TruncationMode = Literal["keep_start", "keep_end"]


def _rows(batch: PairRows | Sequence[Mapping[str, Any]], kind: str) -> PairRows:
    rows = batch if isinstance(batch, PairRows) else rows_from_examples(batch)
    if rows.kind != kind:
        raise EtlError(f"this collate takes {kind} rows, got {rows.kind} rows")
    if len(rows) == 0:
        raise EtlError("cannot collate an empty batch; check the sampler's batch_size")
    return rows


def collate_pairs(
    batch: PairRows | Sequence[Mapping[str, Any]],
    *,
    pad_id: int,
    pad_to_multiple_of: int | None = None,
    max_length: int | None = None,
    truncation_mode: TruncationMode = "keep_start",
    width: int | None = None,
) -> dict[str, np.ndarray]:
    """B preference pairs -> TRL's padded batch: row i = prompt_i + chosen_i, row B + i =
    prompt_i + rejected_i, then ``pad_id``.

    Trade-off: the prompt is computed twice (once per completion) and rows pad to the longest
    of the 2B; the prefix-shared packed layout (`etl.loader.pairs.pack`) computes it once and
    barely pads, but needs a custom attention mask.

    Args:
        batch: a `PairRows` of kind ``preference``, or per-pair dicts (``prompt_ids``,
            ``chosen_ids``, ``rejected_ids``, optional ``chosen_mask`` / ``rejected_mask``).
        pad_id: id after each row's last token (TRL's ``pad_token_id``).
        pad_to_multiple_of: round L up to a multiple of it (TRL's argument), None: no rounding.
        max_length: cut each sequence to this many tokens first (TRL's argument), None: no cut.
        truncation_mode: ``keep_start`` keeps the first ``max_length`` tokens, ``keep_end``
            the last (TRL's values).
        width: a fixed L instead (steady shapes; every kept sequence must fit), None: the longest.

    Returns:
        ``input_ids``, ``attention_mask`` (1 on real tokens), ``completion_mask`` (1 on trained
        completion tokens), each (2B, L) int64; token t is predicted by the logits of t - 1
        (`etl.train.dpo.completion_logps`).

    Raises:
        EtlError: an empty batch, rows of another kind, a bad mode, or ``width`` too small.
    """
    rows = _rows(batch, PREFERENCE)
    if truncation_mode not in ("keep_start", "keep_end"):
        raise EtlError(f"truncation_mode must be 'keep_start' or 'keep_end', got {truncation_mode!r}")
    if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
        raise EtlError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
    seqs = concat([rows.join([0, 1]), rows.join([0, 2])])  # chosen rows, then rejected rows
    lengths = seqs.lengths.astype(np.int64, copy=False)
    kept = lengths if max_length is None else np.minimum(lengths, max_length)
    longest = int(kept.max(initial=0))
    if width is None:
        multiple = pad_to_multiple_of or 1
        width = -(-longest // multiple) * multiple
    elif width < longest:
        raise EtlError(f"a pair's sequence holds {longest} tokens, more than width={width}; "
                       f"pass max_length={width} to cut it, or a larger width")
    first = seqs.starts + (lengths - kept if truncation_mode == "keep_end" else 0)
    col = np.arange(width, dtype=np.int64)
    valid = col[None, :] < kept[:, None]
    src = first[:, None] + col[None, :]  # past a row's end: clipped, then overwritten
    ids = np.take(seqs.ids, src, mode="clip") if seqs.ids.size else np.zeros(src.shape, np.int64)
    trained = np.take(seqs.mask, src, mode="clip") if seqs.ids.size else np.zeros(src.shape, bool)
    return {
        INPUT_IDS: np.where(valid, ids, pad_id).astype(np.int64, copy=False),
        "attention_mask": valid.astype(np.int64),
        COMPLETION_MASK: (valid & trained).astype(np.int64),  # type: ignore[operator]
    }


def collate_unpaired(
    batch: PairRows | Sequence[Mapping[str, Any]], *, strategy: str = "fixed", **options: Any
) -> dict[str, np.ndarray]:
    """Unpaired (KTO) rows -> an SFT batch of prompt + completion (`etl.loader.collate`: ``x``,
    ``y``, ``loss_mask`` = the completion's mask, shifted) plus ``label`` (B,) bool, plus the
    mismatched rows of KTO's KL term: ``kl_x``, ``kl_y``, ``kl_loss_mask``, ``kl_attention_mask``,
    row i = prompt i + the completion of row i - 1 (row 0: of the last row), as TRL's
    ``KL_completion_ids`` cycles them (`etl.train.kto.unpaired_logps`).

    Trade-off: the mismatched rows double the collate's work (one more vectorized gather) for
    a term KTO needs in every step; with one row a batch the mismatched row is the row itself.

    Args:
        batch: a `PairRows` of kind ``unpaired``, or dicts with ``prompt_ids``,
            ``completion_ids``, optional ``completion_mask``, ``label``.
        strategy, **options: as `etl.loader.collate.collate` (``seq_len``, ``pad_id``, ...).
    """
    rows = _rows(batch, UNPAIRED)
    out = collate(rows.join(), strategy=strategy, **options)
    out[LABEL] = np.asarray(rows.label, dtype=bool)
    prompt, completion = rows.parts
    previous = np.roll(np.arange(len(rows)), 1)  # only starts and lengths move: no token copied
    mismatched = PairRows(rows.kind, (prompt, completion.reorder(previous)), rows.label)
    kl = collate(mismatched.join(), strategy=strategy, **options)
    out.update({f"kl_{k}": kl[k] for k in ("x", "y", "loss_mask", "attention_mask")})
    return out
