"""Stream packing with boundary injection: documents cut into blocks of S tokens, rewritten at cuts.

The examples are concatenated in order (each already ends with the template's EOS, a conversation
reset) and cut every S tokens. A block that starts inside a user span is rewritten to start with
the document's system span and the user header (extra, untrained pieces of the same example); an
assistant span trains only when its user span lies whole in the same block. Any template works:
the spans come from the `turns` table (`TurnSpans`); post_training's ``<|USER|>`` is the case the
rules were written for.
"""

from __future__ import annotations

import warnings
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from etl.errors import EtlError, EtlWarning
from etl.packing.pieces import Packing
from etl.packing.turn_spans import ROLE_ASSISTANT, ROLE_SYSTEM, ROLE_USER, TurnSpans

# Piece kinds inside a block, in their order there: system span, user header, stream tokens.
_SYSTEM, _HEADER, _STREAM = 0, 1, 2


@dataclass(frozen=True)
class _Users:
    """User spans in stream coordinates (token offsets into the concatenated documents)."""

    start: np.ndarray  # (U,) int64, sorted
    end: np.ndarray  # (U,) int64
    header_end: np.ndarray  # (U,) int64 start + header tokens
    doc: np.ndarray  # (U,) int64
    sys_start: np.ndarray  # (U,) int64 the document's last system span before the user; 0 if none
    sys_end: np.ndarray  # (U,) int64 == sys_start when there is none


@dataclass(frozen=True)
class _Blocks:
    """Blocks in stream coordinates: block b holds stream tokens ``[start[b], end[b])``."""

    start: np.ndarray  # (B,) int64, increasing; gaps between blocks are skipped tails
    end: np.ndarray  # (B,) int64
    user: np.ndarray  # (B,) int64 user span the block starts inside (rewritten), else -1


def _check(lengths: np.ndarray, turns: TurnSpans, seq_len: int) -> None:
    """Raise `EtlError` when the turns do not lie inside the documents, in order."""
    if seq_len < 1:
        raise EtlError(f"seq_len must be positive, got {seq_len}")
    if lengths.ndim != 1 or (lengths < 0).any():
        raise EtlError("lengths must be a 1-D array of token counts >= 0")
    if len(turns) == 0:
        return
    fits = (turns.doc >= 0) & (turns.doc < len(lengths)) & (turns.start >= 0) & (turns.start <= turns.end)
    if not fits.all() or (turns.end > lengths[turns.doc]).any():
        raise EtlError(
            "turn spans fall outside the documents' lengths: build the turns with turn_spans() from "
            "the same split's turns table and data ids as the lengths"
        )
    same_doc = turns.doc[1:] == turns.doc[:-1]
    if (turns.doc[1:] < turns.doc[:-1]).any() or (same_doc & (turns.start[1:] < turns.end[:-1])).any():
        raise EtlError("turn spans must be sorted by doc and start without overlapping (use turn_spans())")


def _users(turns: TurnSpans, offsets: np.ndarray) -> _Users:
    """User spans with the system span a rewrite injects: the last one ending before the user."""
    at = offsets[turns.doc]
    is_user, is_sys = turns.role == ROLE_USER, turns.role == ROLE_SYSTEM
    start, end, doc = (at + turns.start)[is_user], (at + turns.end)[is_user], turns.doc[is_user]
    # A sentinel system span (doc -1, empty) in front: every user finds one, wrong-doc means none.
    sys_start = np.concatenate([[0], (at + turns.start)[is_sys]]).astype(np.int64)
    sys_end = np.concatenate([[0], (at + turns.end)[is_sys]]).astype(np.int64)
    sys_doc = np.concatenate([[-1], turns.doc[is_sys]]).astype(np.int64)
    j = np.searchsorted(sys_end, start, side="right") - 1
    has = sys_doc[j] == doc
    return _Users(
        start=start,
        end=end,
        header_end=start + turns.header_len[is_user],
        doc=doc,
        sys_start=np.where(has, sys_start[j], 0),
        sys_end=np.where(has, sys_end[j], 0),
    )


def _cut_blocks(offsets: np.ndarray, users: _Users, seq_len: int) -> tuple[_Blocks, int]:
    """Where each block starts and ends in the stream, and how many tails were skipped for progress.

    Not vectorizable: a rewrite shortens its block's stream share by the injected tokens, so every
    later cut depends on it. One Python step per block (bisect over lists, no loop per token or
    turn): a small share of `stream`'s time (docs/design.md, Measured costs).
    """
    cum, total = offsets.tolist(), int(offsets[-1])
    u_start, u_end, u_head = users.start.tolist(), users.end.tolist(), users.header_end.tolist()
    u_sys = (users.sys_end - users.sys_start).tolist()
    found: list[tuple[int, int, int]] = []  # (start, end, rewritten user or -1) of each block
    g, skipped = 0, 0
    while g < total:
        k = bisect_right(u_start, g) - 1
        if k >= 0 and u_start[k] < g < u_end[k]:  # strictly inside user span k: rewrite
            room = seq_len - u_sys[k] - (min(g, u_head[k]) - u_start[k])
            doc_end = cum[bisect_right(cum, g)]
            if room < 1:  # system span + header fill the block: skip the tail, or no progress
                g, skipped = doc_end, skipped + 1
                continue
            end = g + room
            # Boundary injection: a block that starts mid-user and ends before that user's end stops
            # packing the rest of that document (its assistant would dangle).
            nxt = doc_end if end < u_end[k] else min(end, total)
            found.append((g, min(end, total), k))
            g = nxt
        else:
            end = min(g + seq_len, total)
            found.append((g, end, -1))
            g = end
    start, end, user = np.array(found, dtype=np.int64).reshape(-1, 3).T
    return _Blocks(start=start, end=end, user=user), skipped


def _segments(offsets: np.ndarray, blocks: _Blocks) -> tuple[np.ndarray, ...]:
    """Each block's share of each document: ``(block, doc, start, end)``, stream coordinates."""
    first = np.searchsorted(offsets, blocks.start, side="right") - 1
    last = np.searchsorted(offsets, blocks.end, side="left") - 1
    counts = last - first + 1
    block = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    doc = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts) + first[block]
    start = np.maximum(blocks.start[block], offsets[doc])
    end = np.minimum(blocks.end[block], offsets[doc + 1])
    keep = end > start  # empty documents inside a block
    return block[keep], doc[keep], start[keep], end[keep]


def _masked(turns: TurnSpans, offsets: np.ndarray, users: _Users, blocks: _Blocks) -> tuple[np.ndarray, np.ndarray]:
    """Assistant spans the stream packer masks, as sorted ``(start, end)`` in stream coordinates.

    Trained only when the span's user turn (the last one before it in its document) and the whole
    span lie in one block, the user from its first token (not a rewritten continuation). Masked
    otherwise: no user before it, cut by the block's end (unmatched), or continued from a block.
    """
    at = offsets[turns.doc]
    is_assistant = turns.role == ROLE_ASSISTANT
    start, end, doc = (at + turns.start)[is_assistant], (at + turns.end)[is_assistant], turns.doc[is_assistant]
    user_start = np.concatenate([[-1], users.start])  # sentinel user of doc -1: "no user"
    user_doc = np.concatenate([[-1], users.doc])
    u = np.searchsorted(user_start, start, side="left") - 1
    b = np.maximum(np.searchsorted(blocks.start, start, side="right") - 1, 0)
    trained = (user_doc[u] == doc) & (end <= blocks.end[b]) & (user_start[u] >= blocks.start[b])
    return start[~trained], end[~trained]


def _split(segments: tuple[np.ndarray, ...], mask_start: np.ndarray, mask_end: np.ndarray) -> tuple[np.ndarray, ...]:
    """Segments cut where a masked span starts or ends: ``(segment, start, end, trained)``.

    Elementary intervals between all boundaries are either inside one segment or in a skipped
    gap, and wholly masked or not; runs of equal flags in a segment are merged back into one piece.
    """
    _, _, seg_start, seg_end = segments
    cuts = np.unique(np.concatenate([seg_start, seg_end, mask_start, mask_end]))
    lo, hi = cuts[:-1], cuts[1:]
    seg = np.searchsorted(seg_start, lo, side="right") - 1
    inside = (seg >= 0) & (lo < seg_end[np.maximum(seg, 0)])
    lo, hi, seg = lo[inside], hi[inside], seg[inside]
    starts, ends = np.concatenate([[-1], mask_start]), np.concatenate([[-1], mask_end])  # sentinel
    masked = lo < ends[np.searchsorted(starts, lo, side="right") - 1]
    new = np.ones(len(lo), dtype=bool)
    new[1:] = (seg[1:] != seg[:-1]) | (masked[1:] != masked[:-1])
    run = np.flatnonzero(new)
    last = np.append(run[1:], len(lo)) - 1
    return seg[run], lo[run], hi[last], ~masked[run]


def _injected(offsets: np.ndarray, users: _Users, blocks: _Blocks) -> tuple[np.ndarray, ...]:
    """The pieces rewrites put in front of their blocks: ``(doc, start, length, pack, kind, key)``.

    The system span whole; the user header from its first token up to the cut or the header's end,
    whichever comes first, so header + continuation are the user span's own tokens in order.
    """
    block = np.flatnonzero(blocks.user >= 0)
    k = blocks.user[block]
    doc = users.doc[k]
    sys_len = users.sys_end[k] - users.sys_start[k]
    head_len = np.minimum(blocks.start[block], users.header_end[k]) - users.start[k]
    has_sys, has_head = sys_len > 0, head_len > 0

    def both(sys_part: np.ndarray, head_part: np.ndarray) -> np.ndarray:
        return np.concatenate([sys_part[has_sys], head_part[has_head]]).astype(np.int64)

    kinds = np.full(len(block), _SYSTEM), np.full(len(block), _HEADER)
    return (
        both(doc, doc),
        both(users.sys_start[k] - offsets[doc], users.start[k] - offsets[doc]),
        both(sys_len, head_len),
        both(block, block),
        both(*kinds),
        both(users.sys_start[k], users.start[k]),
    )


def stream(lengths: np.ndarray, *, seq_len: int, seed: int = 0, turns: TurnSpans) -> Packing:
    """Stream packing with boundary injection: concatenate, cut every ``seq_len`` tokens, rewrite cuts.

    Trade-off: no padding (every block but the last holds exactly ``seq_len`` tokens) and the
    order is kept, but documents are split across blocks, rewrites repeat system spans and user
    headers, and assistant spans cut by a block boundary lose their loss.

    Rules, with documents = examples (each ends with the template's
    EOS, so a document boundary resets the conversation: no system span crosses it):

    - A block starting strictly inside a user span begins with the document's last system span
      before that user (if any) and the user's header tokens, as untrained pieces of the same
      example, then the continuation; the stream goes on where it was cut (injected tokens are
      extra). If it ends before the user's end, the rest of that document is skipped.
    - If the system span and header leave no room for one continuation token, the rest of the
      document is skipped to guarantee progress (an `EtlWarning` counts such documents).
    - An assistant span keeps the data's loss mask (``trained`` True) only when its user span
      (the last before it in the document) starts and the assistant ends inside the same block;
      otherwise its pieces are ``trained=False``: unmatched, continued, after a rewritten
      (incomplete) user, or with no user before it. Other tokens keep the data's mask.

    Args:
        lengths: (N,) tokens of each example, in stream order.
        seq_len: tokens per block, S.
        seed: unused (no random choice); part of the packers' common signature.
        turns: the examples' kept turns (`turn_spans`), example numbers indexing ``lengths``.

    Returns:
        Pieces in block order (pack = block number); inside a block the system span, the header,
        then the stream's pieces. ``trained`` is always an array.

    Raises:
        EtlError: for seq_len < 1 or turns that do not fit the lengths.
    """
    del seed
    lengths = np.asarray(lengths, dtype=np.int64)
    _check(lengths, turns, seq_len)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    users = _users(turns, offsets)
    blocks, skipped = _cut_blocks(offsets, users, seq_len)
    if skipped:
        warnings.warn(
            f"stream packing skipped the rest of {skipped} documents whose system span and user header "
            f"fill a block of {seq_len} tokens; use a larger --seq-len to keep them",
            EtlWarning,
            stacklevel=2,
        )
    if len(blocks.start) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Packing(doc=empty, start=empty, length=empty, pack=empty, num_packs=0, trained=np.zeros(0, bool))
    segments = _segments(offsets, blocks)
    seg, lo, hi, trained = _split(segments, *_masked(turns, offsets, users, blocks))
    block, doc = segments[0][seg], segments[1][seg]
    i_doc, i_start, i_len, i_pack, i_kind, i_key = _injected(offsets, users, blocks)
    pack = np.concatenate([i_pack, block])
    order = np.lexsort((np.concatenate([i_key, lo]), np.concatenate([i_kind, np.full(len(lo), _STREAM)]), pack))
    return Packing(
        doc=np.concatenate([i_doc, doc])[order],
        start=np.concatenate([i_start, lo - offsets[doc]])[order],
        length=np.concatenate([i_len, hi - lo])[order],
        pack=pack[order],
        num_packs=len(blocks.start),
        trained=np.concatenate([np.zeros(len(i_doc), dtype=bool), trained])[order],
    )
