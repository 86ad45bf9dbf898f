"""Prefix-shared packing: each pair once as ``[prompt, chosen, rejected]``, several pairs a row.

The padded layout (`etl.loader.pairs.collate`) runs every prompt twice and pads each of 2B rows
to the longest; here a pair costs P + C + R tokens instead of 2 x (P + max(C, R)), and bfd
fills rows of S. The rejected tokens restart their positions at P, so with the mask of
`etl.loader.pairs.attention` (rejected sees its prompt and itself, never the chosen tokens)
every token computes what it computes in the padded layout. The first rejected token is
predicted by the last prompt token, not by the token before it (the last chosen one):
``logits_index`` says, for every token, which position's logits predict it.

Pure numpy: an item table (pairs and each row's padding, in cell order) expanded with one
``np.repeat`` per per-cell array, as `etl.loader.collate_packed` does, and one token gather.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from etl.columns import COMPLETION_MASK, INPUT_IDS, check_seq_len
from etl.errors import EtlBug, EtlError
from etl.kinds import KINDS
from etl.loader.pack_request import PackRequest
from etl.loader.pairs.rows import PairRows
from etl.packing.registry import pack
from etl.ragged import PackedBatch, Ragged

# part_ids codes: which part of its pair a token is (0: padding).
PART_PAD, PART_PROMPT, PART_CHOSEN, PART_REJECTED = 0, 1, 2, 3
# Batch keys of the packed layout beyond input_ids, position_ids and completion_mask.
PAIR_IDS, PART_IDS, LOGITS_INDEX = "pair_ids", "part_ids", "logits_index"
# Packers that keep every pair whole (sequential and stream split examples across rows).
PAIR_PACKERS = ("bfd", "ffd")


@dataclass(frozen=True)
class PackedPairs:
    """B packed rows of whole pairs.

    Attributes:
        rows: the pairs, compact, in layout order (row 0's pairs first).
        row: (N,) int64 batch row of each pair, non-decreasing.
        num_rows: B (a row with no pair is all padding).
    """

    rows: PairRows
    row: np.ndarray
    num_rows: int


@dataclass(frozen=True)
class LabeledPack:
    """Packed unpaired (KTO) rows: SFT pieces of prompt + completion and each piece's label."""

    batch: PackedBatch
    label: np.ndarray


def pair_pieces(docs: PairRows, rows: np.ndarray, req: PackRequest) -> PackedPairs | LabeledPack:
    """The batch a `PackRequest` asks of `PairRows` ``docs`` (``rows``: its pieces' rows in ``docs``).

    Raises:
        EtlError: a preference piece that is not its whole pair (a packer that splits or cuts).
    """
    taken = docs.take(rows)
    if KINDS[taken.kind].paired:
        if np.any(req.start != 0) or np.any(req.length != taken.lengths):
            raise EtlError(f"prefix-shared packing keeps pairs whole: pack with {PAIR_PACKERS} and a seq_len "
                           "no pair exceeds (the loader skips longer pairs)")
        return PackedPairs(taken, np.asarray(req.row, dtype=np.int64), req.num_rows)
    joined = taken.join()
    pieces = Ragged(joined.ids, joined.starts + req.start, np.asarray(req.length, np.int64), joined.mask)
    return LabeledPack(PackedBatch(pieces, req.row, req.segment, req.num_rows, req.trained), np.asarray(taken.label))


def pack_pairs(
    rows: PairRows, *, seq_len: int, strategy: str = "bfd", **options: Any
) -> tuple[PackedPairs, np.ndarray, np.ndarray]:
    """Bin-pack every pair that fits (P + C + R <= S) into rows of S tokens, all of them in one batch.

    Trade-off: bfd leaves ~no padding but changes the order of the pairs; a pair longer than S
    cannot share its prompt in a row: it is skipped and returned (train it padded, or pack with
    a larger S), never cut.

    Args:
        rows: preference pairs.
        seq_len: S, tokens a row.
        strategy: ``bfd`` or ``ffd`` (`PAIR_PACKERS`).
        **options: the packer's ``buffer_docs`` / ``max_docs_per_bin``.

    Returns:
        (the packed rows, (N,) index into ``rows`` of each packed pair in layout order,
        the indices of the skipped pairs).
    """
    check_seq_len(seq_len)
    if strategy not in PAIR_PACKERS:
        raise EtlError(f"prefix-shared packing keeps pairs whole: strategy must be one of {PAIR_PACKERS}, "
                       f"got {strategy!r}")
    lengths = rows.lengths
    fits = np.flatnonzero(lengths <= seq_len)
    if len(fits) == 0:
        raise EtlError(f"no pair fits in seq_len={seq_len} (prompt + chosen + rejected); pass a larger seq_len")
    packing = pack(strategy, lengths[fits], seq_len=seq_len, **options)
    order = fits[packing.doc]
    skipped = np.setdiff1d(np.arange(len(rows)), fits)
    return PackedPairs(rows.take(order), packing.pack.astype(np.int64), packing.num_packs), order, skipped


def _place(batch: PackedPairs, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(N,) column and 1-based number of each pair in its row, (B,) tokens and pairs per row.

    Raises:
        EtlError: a row over S tokens (packed with another S).
        EtlBug: rows unsorted or out of range (a bug of whoever built the batch).
    """
    row = batch.row.astype(np.int64, copy=False)
    lengths = batch.rows.lengths
    if len(row) != len(batch.rows) or batch.num_rows < 1 or np.any(np.diff(row) < 0) or (
            len(row) and not 0 <= row[0] <= row[-1] < batch.num_rows):
        raise EtlBug("malformed PackedPairs: it needs rows, one row per pair, sorted and in range")
    row_len = np.bincount(row, weights=lengths, minlength=batch.num_rows).astype(np.int64)
    if row_len.max() > seq_len:
        raise EtlError(f"a packed row holds {int(row_len.max())} tokens, more than seq_len={seq_len}; "
                       "pack with the same seq_len as the collate")
    counts = np.bincount(row, minlength=batch.num_rows)
    col = (np.cumsum(lengths) - lengths) - (np.cumsum(row_len) - row_len)[row]
    pair_id = np.arange(len(row)) - (np.cumsum(counts) - counts)[row] + 1
    return col, pair_id, row_len, counts


# Rows of the item table (one column per pair, then one per row's padding).
_LEN, _PAIR, _COL, _PROMPT, _CHOSEN, _SRC = range(6)


def _items(batch: PackedPairs, seq_len: int, src_start: np.ndarray) -> np.ndarray:
    """(6, N + B) int64 item table in cell order: row 0's pairs, row 0's padding, row 1's ..."""
    col, pair_id, row_len, counts = _place(batch, seq_len)
    num, rows = len(col), batch.num_rows
    table = np.empty((6, num + rows), dtype=np.int64)
    pairs, pads = table[:, :num], table[:, num:]
    pairs[_LEN], pads[_LEN] = batch.rows.lengths, seq_len - row_len
    pairs[_PAIR], pads[_PAIR] = pair_id, 0
    pairs[_COL], pads[_COL] = col, row_len
    pairs[_PROMPT], pads[_PROMPT] = batch.rows.parts[0].lengths, seq_len  # padding: positions count on
    pairs[_CHOSEN], pads[_CHOSEN] = batch.rows.parts[1].lengths, 0
    pairs[_SRC], pads[_SRC] = src_start - col, -row_len  # padding reads clipped garbage, replaced
    pad_slot = np.cumsum(counts) + np.arange(rows)
    order = np.empty(num + rows, dtype=np.int64)
    order[batch.row + np.arange(num)] = np.arange(num)
    order[pad_slot] = num + np.arange(rows)
    return table[:, order]


def collate_pairs_packed(batch: PackedPairs, *, seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """Packed pairs -> (B, S) arrays of the prefix-shared layout.

    Trade-off: ~no padding and each prompt computed once, but the model needs the pair mask
    (`etl.loader.pairs.attention`: a dense SDPA mask or a FlexAttention `BlockMask`; flash-attn's
    varlen kernels cannot express it) and the log-probs need `completion_logps`, not a shift.

    Args:
        batch: B rows of whole pairs (`pack_pairs`, or the loader's sampler).
        seq_len: S, the tokens of a row.
        pad_id: id after a row's last pair.

    Returns:
        ``input_ids`` (B, S) int64; ``position_ids`` (B, S) int64: 0..P + C - 1 over prompt and
        chosen, P..P + R - 1 over rejected, counting from 0 over the padding; ``pair_ids`` (B, S)
        int32, 1..k a row, 0 on padding; ``part_ids`` (B, S) int32 (`PART_PROMPT`,
        `PART_CHOSEN`, `PART_REJECTED`, `PART_PAD`); ``completion_mask`` (B, S) int64, 1 on the
        completion tokens whose log-prob counts (trained, and predicted inside their pair: not
        a pair's first token); ``logits_index`` (B, S) int64, the column whose logits predict
        each token (t - 1, but P's last token for the first rejected one).

    Raises:
        EtlError: a row over S tokens. EtlBug: a malformed batch.
    """
    check_seq_len(seq_len)
    rows = batch.rows
    if not KINDS[rows.kind].paired:
        raise EtlError(f"prefix-shared packing takes preference pairs, got {rows.kind} rows")
    joined = rows.join()  # each pair's [prompt, chosen, rejected], back to back
    it = _items(batch, seq_len, joined.starts)
    num_rows = batch.num_rows

    def cells(item_row: np.ndarray) -> np.ndarray:
        return np.repeat(item_row, it[_LEN]).reshape(num_rows, seq_len)

    col = np.arange(seq_len, dtype=np.int64)
    start = cells(it[_COL])
    offset = col - start
    pair, prompt, chosen = cells(it[_PAIR]), cells(it[_PROMPT]), cells(it[_CHOSEN])
    valid = pair > 0
    src = cells(it[_SRC]) + col
    ids = np.take(joined.ids, src, mode="clip") if joined.ids.size else np.zeros(src.shape, np.int64)
    trained = np.take(joined.mask, src, mode="clip") if joined.ids.size else np.zeros(src.shape, bool)
    part = np.where(offset < prompt, PART_PROMPT, np.where(offset < prompt + chosen, PART_CHOSEN, PART_REJECTED))
    rejected = part == PART_REJECTED
    logits_index = np.broadcast_to(col - 1, (num_rows, seq_len)).copy()
    # The first rejected token follows the prompt, not the chosen tokens: one write per pair.
    first_rej = valid & rejected & (offset == prompt + chosen)
    logits_index[first_rej] -= chosen[first_rej]
    trained &= valid & (logits_index >= start)  # a pair's first token (P = 0) has no predictor
    return {
        INPUT_IDS: np.where(valid, ids, pad_id).astype(np.int64, copy=False),
        "position_ids": np.where(rejected, offset - chosen, offset),
        PAIR_IDS: pair.astype(np.int32),
        PART_IDS: np.where(valid, part, PART_PAD).astype(np.int32),
        COMPLETION_MASK: trained.astype(np.int64),  # type: ignore[union-attr]
        LOGITS_INDEX: np.maximum(logits_index, 0),
    }
