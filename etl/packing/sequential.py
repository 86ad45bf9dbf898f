"""Chomp-style sequential packer: the documents as one token stream cut into windows of S tokens.

Fully vectorized: a cumsum of the lengths and breakpoints at multiples of S (docs/design.md,
Measured costs).
"""

from __future__ import annotations

import numpy as np

from etl.packing.bins import check_lengths
from etl.packing.pieces import Packing


def sequential(lengths: np.ndarray, *, seq_len: int, seed: int = 0) -> Packing:
    """Windows of exactly ``seq_len`` tokens over the documents in stream order (chomp's default mode).

    Documents are appended to a rolling buffer in the order given and every ``seq_len`` tokens
    the buffer is emitted as one pack, so a document is split across windows (its later pieces
    have ``start > 0``). The last window may be short and is kept: no token is lost. Trade-off:
    perfect utilization and stream order, but documents are cut and a window's first piece
    sees none of its document's beginning (unless the loader keeps stream semantics).

    Args:
        lengths: (N,) tokens of every document (>= 1 each).
        seq_len: S, the tokens of a window.
        seed: unused (no random choice); kept for the common `PackFn` signature.

    Returns:
        Pieces in stream order; pack k is stream tokens ``[k * S, (k + 1) * S)``.

    Raises:
        EtlError: when ``seq_len`` < 1 or a length is not positive (empty documents are rejected,
            not skipped, so every example lands in some pack).
    """
    del seed
    lengths = check_lengths(lengths, seq_len=seq_len)
    ends = np.cumsum(lengths)
    offsets = ends - lengths
    first_win = offsets // seq_len
    last_win = (ends - 1) // seq_len
    counts = last_win - first_win + 1
    total = int(counts.sum())
    doc = np.repeat(np.arange(len(lengths), dtype=np.int64), counts)
    # j-th piece of its document: position in the flat piece array minus the document's first.
    first_piece = np.cumsum(counts) - counts
    window = first_win[doc] + np.arange(total, dtype=np.int64) - first_piece[doc]
    begin = np.maximum(offsets[doc], window * seq_len)
    end = np.minimum(ends[doc], (window + 1) * seq_len)
    num_packs = int(-(-int(ends[-1]) // seq_len)) if len(lengths) else 0
    return Packing(
        doc=doc, start=begin - offsets[doc], length=end - begin, pack=window, num_packs=num_packs
    )
