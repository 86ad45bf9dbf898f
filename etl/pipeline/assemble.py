"""Assemble examples from planned turns with numpy: one gather builds every token list of a chunk.

Each kept turn contributes eight pieces in order (BOS, header, reasoning, content, calls, end,
separator, EOS; BOS/EOS only on a conversation's first/last turn). A piece is a range of a source buffer
plus a training flag; clipping the ranges to the hard-cut window and gathering them in one
`np.repeat` + `arange` pass gives the flat `input_ids`, and `np.repeat` of the flags gives
`loss_mask`. Cost is O(tokens) in C, far below rebuilding the lists in Polars (`agg(list.explode())`,
or `explode` + `group_by`; the times: docs/design.md, Measured costs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from etl import columns as c
from etl.arrow_values import from_numpy, list_offsets, numbers_of
from etl.ragged import gather_pieces
from etl.tokens.tool_format import WITH_TOOLS

PIECES = 8


@dataclass(frozen=True)
class Assembled:
    """Flat token data of a chunk's conversations, in conversation order."""

    conv: np.ndarray  # conversation number of each example
    offsets: np.ndarray  # int64, len(conv) + 1
    ids: np.ndarray  # int32 flat
    mask: np.ndarray  # bool flat
    weight: np.ndarray | None = None  # float32 flat: the message weight on trained tokens, else 0

    def num_trained(self) -> np.ndarray:
        # reduceat over uint8 runs faster than a cumsum of bools (which converts per element;
        # docs/design.md, Measured costs); empty examples would get a neighbour's value, so they
        # are zeroed.
        lengths = np.diff(self.offsets)
        if not len(lengths):
            return np.zeros(0, np.int32)
        starts = np.minimum(self.offsets[:-1], max(len(self.mask) - 1, 0))
        counts = np.add.reduceat(self.mask.view(np.uint8), starts, dtype=np.int64) if len(self.mask) else lengths
        return np.where(lengths > 0, counts, 0).astype(np.int32)

    def list_arrays(self) -> tuple[pa.ListArray, pa.ListArray]:
        offsets = from_numpy(self.offsets.astype(np.int32))
        return (
            pa.ListArray.from_arrays(offsets, from_numpy(self.ids.astype(np.int32, copy=False))),
            pa.ListArray.from_arrays(offsets, from_numpy(self.mask.astype(np.bool_, copy=False))),
        )

    def weight_array(self) -> pa.ListArray | None:
        if self.weight is None:
            return None
        offsets = from_numpy(self.offsets.astype(np.int32))
        return pa.ListArray.from_arrays(offsets, from_numpy(self.weight.astype(np.float32, copy=False)))


def _list_parts(col: pl.Series) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """(flat values per chunk, chunk, start and length of each row) of a list<int32> column.

    Zero-copy: chunk by chunk, since `to_arrow` of a several-chunk Series copies every value.
    """
    flats, chunk, starts, lengths = [], [], [], []
    for j, part in enumerate(col.get_chunks()):
        arr = part.to_arrow()
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        arr = arr.cast(pa.large_list(pa.int32()))
        offsets = list_offsets(arr)
        # `values` is the whole child array, shared by every chunk sliced from one array.
        values = numbers_of(arr.values, np.int32)
        flats.append(values[offsets[0] : offsets[-1]] if len(offsets) else values[:0])
        chunk.append(np.full(len(arr), j, dtype=np.int64))
        starts.append(offsets[:-1] - (offsets[0] if len(offsets) else 0))
        lengths.append(np.diff(offsets))
    if not flats:
        return [], *(np.zeros(0, np.int64),) * 3
    return flats, np.concatenate(chunk), np.concatenate(starts), np.concatenate(lengths)


def _first_last(conv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    first = np.ones(len(conv), dtype=bool)
    first[1:] = conv[1:] != conv[:-1]
    last = np.ones(len(conv), dtype=bool)
    last[:-1] = conv[1:] != conv[:-1]
    return first, last


def _pieces(
    turns: pl.DataFrame,
    rows: np.ndarray,
    conv: np.ndarray,
    *,
    bos_ids: list[int],
    eos_ids: list[int],
    system: list[int],
) -> tuple[list[np.ndarray], np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """Where each of a kept turn's PIECES comes from: (source arrays, source of every piece,
    start in its source per piece kind, length per piece kind). BOS, EOS and the injected
    system text come from one small constant array; the rest point into the list columns."""
    n = len(rows)
    first, last = _first_last(conv)
    const = np.asarray(bos_ids + eos_ids + system, dtype=np.int32)
    sources, starts, lengths = [const], [np.zeros(n, np.int64)], [first * len(bos_ids)]
    piece_source = np.zeros((n, PIECES), dtype=np.int64)  # BOS and EOS come from `const`
    for k, column in enumerate((c.HEADER_IDS, c.REASONING_IDS, c.CONTENT_IDS, c.CALLS_IDS, c.END_IDS, c.SEP_IDS),
                               start=1):
        flats, chunk, start, length = _list_parts(turns[column])
        piece_source[:, k] = len(sources) + chunk[rows]
        sources += flats
        starts.append(start[rows])
        lengths.append(length[rows])
    starts.append(np.full(n, len(bos_ids)))
    lengths.append(last * len(eos_ids))
    # An inserted system turn that lists tools has content ids of its own (etl.pipeline.tools).
    injected = (turns[c.INJECTED] & (turns[c.FORM] != WITH_TOOLS)).to_numpy()[rows]
    if injected.any():  # the default system text: from `const`, after BOS and EOS
        piece_source[injected, 3] = 0
        starts[3] = np.where(injected, len(bos_ids) + len(eos_ids), starts[3])
        lengths[3] = np.where(injected, len(system), lengths[3])
    return sources, piece_source, starts, lengths


def _piece_flags(turns: pl.DataFrame, rows: np.ndarray) -> np.ndarray:
    """(kept turns, PIECES) training flags: BOS, separator and EOS never train; calls train with the content."""
    n = len(rows)
    content = turns[c.TRAIN_CONTENT].to_numpy()[rows]
    return np.stack([np.zeros(n, bool), turns[c.TRAIN_HEADER].to_numpy()[rows],
                     turns[c.TRAIN_REASONING].to_numpy()[rows], content, content,
                     turns[c.TRAIN_END].to_numpy()[rows], np.zeros(n, bool), np.zeros(n, bool)], axis=1)


def assemble(
    turns: pl.DataFrame,
    *,
    bos_ids: list[int],
    eos_ids: list[int],
    system_ids: list[int] | None = None,
    weights: bool = False,
    untrained: tuple[int, ...] = (),
) -> Assembled:
    """Token lists of every conversation with at least one whole-kept turn.

    Args:
        turns: planned turns (`etl.pipeline.stages.plan_turns`), sorted by conversation and turn.
        bos_ids: ids put once before each conversation (may be empty).
        eos_ids: ids put once after each conversation (may be empty).
        system_ids: the content ids of injected system turns (their rows hold none).
        weights: also build per-token loss weights from the messages' `weight` (default 1).
        untrained: ids that never train wherever they stand (an image's span: only an image gives
            them, since text that spells them is tokenized as text).
    """
    rows = np.flatnonzero(turns[c.KEEP_WHOLE].to_numpy())  # per-turn arrays only: ids stay in place
    n = len(rows)
    conv = turns[c.CONV].to_numpy()[rows]
    sources, piece_source, starts, lengths = _pieces(
        turns, rows, conv, bos_ids=bos_ids, eos_ids=eos_ids, system=list(system_ids or [])
    )

    piece_src = np.stack(starts, axis=1).astype(np.int64)
    piece_len = np.stack(lengths, axis=1).astype(np.int64)
    flags = _piece_flags(turns, rows)
    # Conversation coordinates of each piece: the turn starts at POS (after its BOS, if any).
    bos_len = lengths[0]
    piece_pos = (turns[c.POS].to_numpy()[rows] - bos_len)[:, None] + np.cumsum(piece_len, axis=1) - piece_len
    win_lo = turns[c.CUT].to_numpy()[rows][:, None]
    win_hi = win_lo + turns[c.WINDOW].to_numpy()[rows][:, None]
    lo = np.maximum(piece_pos, win_lo)
    hi = np.minimum(piece_pos + piece_len, win_hi)
    clipped = np.maximum(hi - lo, 0).ravel()
    src_start = (piece_src + (lo - piece_pos)).ravel()

    ids = gather_pieces(sources, piece_source.ravel(), src_start, clipped)
    mask = np.repeat(flags.ravel(), clipped)
    if untrained:  # one pass over the ids, only in runs with images
        mask &= ~np.isin(ids, untrained)

    weight = None
    if weights:
        turn_weight = turns[c.MSG_WEIGHT].fill_null(1.0).to_numpy()[rows].astype(np.float32)
        weight = np.repeat(np.repeat(turn_weight, PIECES), clipped) * mask
    per_turn = clipped.reshape(n, PIECES).sum(axis=1)
    conv_ids, conv_first = np.unique(conv, return_index=True)
    per_conv = np.add.reduceat(per_turn, conv_first) if n else np.zeros(0, np.int64)
    offsets = np.concatenate(([0], np.cumsum(per_conv))).astype(np.int64)
    return Assembled(conv=conv_ids, offsets=offsets, ids=ids, mask=mask, weight=weight)
