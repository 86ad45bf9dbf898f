"""Bin packing in windows of ``buffer_docs`` documents (a chomp-style packing knob), all windows at once.

One numpy step per rank inside a window, over every window side by side: a per-window call of
the run-by-run core in `bins.py` costs tens of seconds for 1M lengths in windows of 1,000
(docs/design.md, Measured costs).
"""

from __future__ import annotations

import numpy as np


def side_by_side(
    clipped: np.ndarray, seq_len: int, max_docs: int, window: int, best: bool
) -> tuple[np.ndarray, int]:
    """Every window of ``window`` documents packed at once, one numpy step per rank in a window.

    Column b of ``cap`` is bin b of every window; a bin not opened yet has capacity S, more
    than any opened one, so best fit (smallest fitting capacity, then lowest id) and first fit
    (lowest fitting id) open a new bin exactly when no open bin fits, as the per-item loop does.
    Cost: ``window`` steps over (open bins x windows) cells, ~N x bins per window (1M T0
    lengths in windows of 1,000: ~1.2e8 cells); grows with the square of ``window``.
    """
    num = -(-len(clipped) // window)
    order = np.lexsort((seq_len - clipped, np.arange(len(clipped)) // window))
    grid = np.zeros(num * window, dtype=np.int32)  # rank r of window w at [w, r]; 0 = no document
    grid[: len(clipped)] = clipped[order]
    grid = grid.reshape(num, window)
    cap = np.full((window, num), seq_len, dtype=np.int32)  # (bin, window): open bins contiguous
    docs = np.zeros((window, num), dtype=np.int32) if max_docs < window else None
    chosen = np.empty((num, window), dtype=np.int64)
    cols = np.arange(num)
    width = 1  # bins opened in any window so far, plus one not opened
    for r in range(window):
        length = grid[:, r]
        fits = cap[:width] >= length
        if docs is not None:
            fits &= docs[:width] < max_docs
        if best:
            col = np.argmin(np.where(fits, cap[:width], seq_len + 1), axis=0)
        else:
            col = np.argmax(fits, axis=0)
        cap[col, cols] -= length
        if docs is not None:
            docs[col, cols] += length > 0
        chosen[:, r] = col
        width = min(window, max(width, int(col.max()) + 2))
    used = np.where(grid > 0, chosen, -1).max(axis=1) + 1
    bins = np.empty(len(clipped), dtype=np.int64)
    bins[order] = (chosen + (np.cumsum(used) - used)[:, None]).ravel()[: len(clipped)]
    return bins, int(used.sum())


def side_by_side_cheaper(clipped: np.ndarray, seq_len: int, window: int) -> bool:
    """Whether `side_by_side` beats one run-by-run core call per window.

    Cost model measured on T0 at S=2048 (docs/design.md, Measured costs): a run step costs as
    much as ~16,000 side-by-side cells; runs are bounded by min(window, S) (about twice the real
    count on T0). The switch falls near windows of ~10,000 T0 documents.
    """
    starts = np.arange(0, len(clipped), window)
    sizes = np.diff(np.append(starts, len(clipped)))
    bins = -(-np.add.reduceat(clipped, starts) // seq_len)
    return int((sizes * bins).sum()) < 8_000 * int(np.minimum(sizes, seq_len).sum())
