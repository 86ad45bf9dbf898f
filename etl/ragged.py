"""`Ragged`: B variable-length examples as flat token arrays plus a (start, length) per example.

Both sources of the loader produce it: Arrow list columns (values + offsets, zero copy) and the
episode export's files (memmapped tokens + episodes.idx). `collate.py` turns it into padded batches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from etl.columns import INPUT_IDS, LOSS_MASK, LOSS_WEIGHT
from etl.errors import EtlError


@dataclass(frozen=True)
class Ragged:
    """Variable-length examples: example i is ``ids[starts[i] : starts[i] + lengths[i]]``.

    Attributes:
        ids: flat token ids (any integer dtype; may be a read-only memmap).
        starts: (B,) int64 offset of each example into ``ids``.
        lengths: (B,) int64 token count of each example.
        mask: flat per-token training mask aligned with ``ids`` (bool, uint8 or float), or None.
        weight: flat per-token float loss weights aligned with ``ids``, or None.
    """

    ids: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    mask: np.ndarray | None = None
    weight: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.starts.shape[0])

    def take(self, rows: np.ndarray) -> Ragged:
        """Copy the selected examples into a new compact `Ragged` (cost: their tokens, not all).

        Args:
            rows: positions of the examples to keep, in the order wanted.

        Returns:
            A `Ragged` whose flat arrays hold only those examples, back to back.
        """
        rows = np.asarray(rows, dtype=np.int64)
        lengths = self.lengths[rows]
        new_starts = np.zeros(len(rows), dtype=np.int64)
        np.cumsum(lengths[:-1], out=new_starts[1:])
        # One gather index for all tokens: position p of example j maps to starts[j] + p.
        src = np.repeat(self.starts[rows] - new_starts, lengths) + np.arange(
            int(lengths.sum()), dtype=np.int64
        )
        return Ragged(
            ids=self.ids[src],
            starts=new_starts,
            lengths=lengths,
            mask=None if self.mask is None else self.mask[src],
            weight=None if self.weight is None else self.weight[src],
        )

    def reorder(self, order: np.ndarray) -> Ragged:
        """The same examples in another order; only starts/lengths move, no token is copied."""
        return Ragged(self.ids, self.starts[order], self.lengths[order], self.mask, self.weight)


@dataclass(frozen=True)
class PackedBatch:
    """B packed rows (`etl.packing`): each row is its pieces back to back, then padding.

    Attributes:
        pieces: one example range per piece, in row order (row 0's pieces first).
        row: (P,) int64 batch row of each piece, non-decreasing.
        segment: (P,) int64 1-based document number of each piece inside its row; consecutive
            pieces of one example share it.
        num_rows: B (rows with no piece are all padding).
        trained: (P,) bool, False where the packer masks the piece's loss (stream packing with
            boundary injection), or None.
    """

    pieces: Ragged
    row: np.ndarray
    segment: np.ndarray
    num_rows: int
    trained: np.ndarray | None = None


def concat(parts: Sequence[Ragged]) -> Ragged:
    """Join compact `Ragged` parts into one (copies their tokens once).

    Args:
        parts: at least one `Ragged`; all must agree on having a mask / weights.

    Returns:
        One `Ragged` with the examples of ``parts`` in order.
    """
    if len(parts) == 1:
        return parts[0]
    sizes = np.array([p.ids.shape[0] for p in parts], dtype=np.int64)
    shift = np.concatenate([[0], np.cumsum(sizes[:-1])])
    has_mask = parts[0].mask is not None
    has_weight = parts[0].weight is not None
    return Ragged(
        ids=np.concatenate([p.ids for p in parts]),
        starts=np.concatenate([p.starts + s for p, s in zip(parts, shift, strict=True)]),
        lengths=np.concatenate([p.lengths for p in parts]),
        mask=np.concatenate([p.mask for p in parts]) if has_mask else None,  # type: ignore[misc]
        weight=np.concatenate([p.weight for p in parts])  # type: ignore[misc]
        if has_weight
        else None,
    )


def _flat(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Flat values and 0-based offsets of a list column (zero copy for int lists)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count:
        raise EtlError("a list column holds nulls; rewrite the data with `etl run`")
    offsets = column.offsets.to_numpy().astype(np.int64, copy=False)
    # flatten() honours slicing; offsets are shifted so they index into the flattened values.
    values = column.flatten().to_numpy(zero_copy_only=False)
    return values, offsets - offsets[0]


def from_arrow(
    ids: pa.Array | pa.ChunkedArray,
    mask: pa.Array | pa.ChunkedArray | None = None,
    weight: pa.Array | pa.ChunkedArray | None = None,
) -> Ragged:
    """Wrap Arrow list columns (``input_ids``, ``loss_mask``, ``loss_weight``) as a `Ragged`.

    Args:
        ids: list<int> column.
        mask: list<bool|uint8> column with the same lengths, or None.
        weight: list<float> column with the same lengths, or None.

    Returns:
        A `Ragged` over the columns' flat buffers (bit-packed booleans are unpacked once).

    Raises:
        EtlError: when the mask or weights do not have the same lengths as the ids.
    """
    values, offsets = _flat(ids)
    ragged_mask = ragged_weight = None
    for name, col in ((LOSS_MASK, mask), (LOSS_WEIGHT, weight)):
        if col is None:
            continue
        other, other_offsets = _flat(col)
        if not np.array_equal(other_offsets, offsets):
            raise EtlError(
                f"`{name}` and `{INPUT_IDS}` differ in length in some rows; "
                "the data is corrupt: rerun `etl run`"
            )
        if name == LOSS_MASK:
            ragged_mask = other if other.dtype == np.bool_ else other != 0
        else:
            ragged_weight = other.astype(np.float32, copy=False)
    return Ragged(values, offsets[:-1], np.diff(offsets), ragged_mask, ragged_weight)


def from_examples(examples: Sequence[Mapping[str, np.ndarray]]) -> Ragged:
    """Build a `Ragged` from per-example dicts (what ``dataset[i]`` returns).

    Args:
        examples: dicts with ``input_ids`` and optionally ``loss_mask`` / ``loss_weight`` arrays.

    Returns:
        A compact `Ragged` (one concatenation per column, no per-token work).
    """
    if not examples:
        raise EtlError("cannot collate an empty batch; check the sampler's batch_size")
    lengths = np.array([len(e[INPUT_IDS]) for e in examples], dtype=np.int64)
    starts = np.zeros(len(examples), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])

    def cat(key: str) -> np.ndarray | None:
        if key not in examples[0]:
            return None
        return np.concatenate([np.asarray(e[key]) for e in examples])

    ids = cat(INPUT_IDS)
    assert ids is not None  # every example dict has input_ids
    return Ragged(ids, starts, lengths, cat(LOSS_MASK), cat(LOSS_WEIGHT))


def range_gather(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Indices of the concatenated ranges [starts[i], starts[i] + lengths[i]).

    One cumulative sum over a delta array (1 inside a range, a jump at each range start)
    instead of repeat + arange: a single pass and a single array, int32 when it fits.
    """
    keep = lengths > 0
    starts, lengths = starts[keep], lengths[keep]
    total = int(lengths.sum())
    dtype = np.int32 if max(total, int(starts.max(initial=0)) + 1) < 2**31 else np.int64
    delta = np.ones(total, dtype=dtype)
    if total:
        firsts = np.cumsum(lengths) - lengths
        prev_last = np.concatenate(([0], (starts + lengths - 1)[:-1]))
        delta[firsts] = starts - prev_last
        delta[0] = starts[0]
    return np.cumsum(delta, dtype=dtype, out=delta)  # in place: one index array, not two


def gather_pieces(
    sources: list[np.ndarray], piece_source: np.ndarray, src_start: np.ndarray, length: np.ndarray
) -> np.ndarray:
    """sources[piece_source[i]][src_start[i] : src_start[i] + length[i]] for every piece, in order.

    One gather from the concatenated sources (faster than a gather and a scatter per source:
    docs/design.md, Measured costs), except that a source of which less than half is kept is
    first cut down to its kept ranges: concatenating it whole copied a 22 MB message's every id
    to keep S of them (bench/big_record.py). Copying what is kept twice costs less than copying
    it all once then.
    """
    if len(sources) == 1:
        return sources[0][range_gather(src_start, length)]
    sources, src_start = list(sources), src_start.copy()
    for k, source in enumerate(sources):
        sel = (piece_source == k) & (length > 0)
        if len(source) > 2 * int(length[sel].sum()):
            sources[k] = source[range_gather(src_start[sel], length[sel])] if sel.any() else source[:0]
            src_start[sel] = np.cumsum(length[sel]) - length[sel]
    base = np.cumsum([0] + [len(source) for source in sources[:-1]])
    return np.concatenate(sources)[range_gather(src_start + base[piece_source], length)]
