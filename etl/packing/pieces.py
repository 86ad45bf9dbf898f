"""`Packing`: what every packer returns, as pieces of examples placed in packs.

A piece is a token range of one example; a pack is the pieces placed in one row of at most S
tokens. Whole-example packers (bfd, ffd) have one piece per example; sequential windows split an
example into pieces; stream packing with boundary injection repeats an example's system span and
user header as extra, untrained pieces. Arrays only: 1M pieces cost ~40 MB.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class Packing:
    """Piece j is tokens ``[start[j], start[j] + length[j])`` of example ``doc[j]``, in pack ``pack[j]``.

    Pieces are sorted by pack, then by their place in it; packs are numbered ``0..num_packs-1`` and
    none is empty.

    Attributes:
        doc: (P,) int64 example of each piece (an index into the lengths given to the packer).
        start: (P,) int64 first token of the piece inside its example.
        length: (P,) int64 tokens of the piece (>= 1).
        pack: (P,) int64 pack of each piece, non-decreasing.
        num_packs: number of packs.
        trained: (P,) bool, False where the packer masks the piece's loss whatever the data's
            loss_mask (the stream packer's boundary rules); None when every piece keeps the data's mask.
    """

    doc: np.ndarray
    start: np.ndarray
    length: np.ndarray
    pack: np.ndarray
    num_packs: int
    trained: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.doc.shape[0])

    def pack_tokens(self) -> np.ndarray:
        """(num_packs,) int64 tokens in each pack."""
        return np.bincount(self.pack, weights=self.length, minlength=self.num_packs).astype(np.int64)

    def utilization(self, seq_len: int) -> float:
        """Real tokens over the tokens of ``num_packs`` rows of ``seq_len`` (1.0 = no padding)."""
        if self.num_packs == 0:
            return 0.0
        return float(self.length.sum()) / (self.num_packs * seq_len)

    def pack_starts(self) -> np.ndarray:
        """(num_packs + 1,) int64 offsets: pack k holds pieces ``[starts[k], starts[k+1])``."""
        return self._pack_starts

    @cached_property
    def _pack_starts(self) -> np.ndarray:
        # Cached: the loader takes B packs per batch from a packing of the whole split, and a
        # bincount over all its pieces per batch would cost more than the take (docs/design.md,
        # Measured costs).
        counts = np.bincount(self.pack, minlength=self.num_packs)
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def segments(self) -> np.ndarray:
        """(P,) int64 1-based document number of each piece inside its pack.

        Consecutive pieces of one example in one pack (the stream packer's injected system span, user
        header and the continuation) are one segment: one document for attention and positions.
        """
        n = len(self)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        new_pack = np.ones(n, dtype=bool)
        new_pack[1:] = self.pack[1:] != self.pack[:-1]
        new_doc = new_pack.copy()
        new_doc[1:] |= self.doc[1:] != self.doc[:-1]
        count = np.cumsum(new_doc)
        # Subtract the count reached before each pack's first piece: 1..k inside every pack.
        first = np.flatnonzero(new_pack)
        before = np.repeat(count[first] - 1, np.diff(np.append(first, n)))
        return (count - before).astype(np.int64)

    def take_packs(self, packs: np.ndarray) -> Packing:
        """The given packs, in that order, renumbered ``0..len(packs)-1`` (a shuffle or a batch).

        Cost: one gather of their pieces (no per-pack Python).
        """
        packs = np.asarray(packs, dtype=np.int64)
        bounds = self.pack_starts()
        counts = bounds[packs + 1] - bounds[packs]
        total = int(counts.sum())
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        src = np.repeat(bounds[packs] - offsets, counts) + np.arange(total, dtype=np.int64)
        return Packing(
            doc=self.doc[src],
            start=self.start[src],
            length=self.length[src],
            pack=np.repeat(np.arange(len(packs), dtype=np.int64), counts),
            num_packs=len(packs),
            trained=None if self.trained is None else self.trained[src],
        )


def held_tokens(packing: Packing, lengths: np.ndarray) -> int:
    """Tokens of the examples that some piece holds, each counted once: the stream packer repeats
    system spans and user headers as extra pieces, and skips tails; a clipped example's cut tokens
    are in no piece. The union of the pieces' ranges laid out as one stream: one argsort of the
    pieces and a running max, no loop per piece (docs/design.md, Measured costs)."""
    if len(packing) == 0:
        return 0
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    lo = offsets[packing.doc] + packing.start
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], (lo + packing.length)[order]
    reach = np.concatenate([[lo[0]], np.maximum.accumulate(hi)[:-1]])  # covered so far, before piece j
    return int(np.maximum(hi - np.maximum(lo, reach), 0).sum())


def keep_end(packing: Packing, lengths: np.ndarray) -> Packing:
    """Left truncation of whole examples clipped to S: each piece keeps its example's last
    tokens (starts at ``len - length``) instead of its first; unclipped pieces start at 0."""
    return replace(packing, start=np.asarray(lengths, dtype=np.int64)[packing.doc] - packing.length)


def whole_examples(bins: np.ndarray, lengths: np.ndarray, num_packs: int) -> Packing:
    """A `Packing` with one piece per example from a bin assignment (bfd, ffd).

    Args:
        bins: (N,) int64 pack of every example.
        lengths: (N,) tokens of every example (already at most S).
        num_packs: number of bins used (every bin 0..num_packs-1 holds an example).

    Returns:
        Pieces sorted by pack, then by example index inside a pack (a stable, readable order).
    """
    order = np.lexsort((np.arange(len(bins)), bins))
    lengths = np.asarray(lengths, dtype=np.int64)
    return Packing(
        doc=order.astype(np.int64),
        start=np.zeros(len(order), dtype=np.int64),
        length=lengths[order],
        pack=np.asarray(bins, dtype=np.int64)[order],
        num_packs=int(num_packs),
    )
