"""Bin packers (chomp-style bin packing): best-fit and first-fit decreasing, every example whole.

Whole input: items by runs of equal length, longest first (at most S runs); the k items of one
length are interchangeable, so a bin takes as many as fit at once (a numpy step per run, not per
item). Windows (``buffer_docs``): all windows side by side, a numpy step per rank in a window.
Both give the same bins as the textbook per-item loop (tests/packing/test_bins.py).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

import numpy as np

from etl.errors import EtlError
from etl.packing.pieces import Packing, whole_examples
from etl.packing.windows import side_by_side, side_by_side_cheaper

# (clipped lengths, S, max docs per bin) -> (bin of every item, bins opened)
_Core = Callable[[np.ndarray, int, int], tuple[np.ndarray, int]]


def check_lengths(lengths: np.ndarray, *, seq_len: int) -> np.ndarray:
    """(N,) int64 copy of ``lengths`` after checking ``seq_len`` >= 1 and every length >= 1.

    Empty examples are rejected rather than skipped so that every example given to a packer
    lands in exactly one pack (the pack index lists every id).

    Raises:
        EtlError: on a non-1-D array, ``seq_len`` < 1 or a length < 1.
    """
    if int(seq_len) < 1:
        raise EtlError(f"seq_len must be at least 1, got {seq_len}")
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise EtlError(f"lengths must be a 1-D array of token counts, got shape {arr.shape}")
    arr = arr.astype(np.int64)
    bad = np.flatnonzero(arr < 1)
    if len(bad):
        raise EtlError(
            f"{len(bad)} example(s) have no tokens (first: example {int(bad[0])}, length "
            f"{int(arr[bad[0]])}); drop empty examples before packing"
        )
    return arr


class _Bins:
    """Remaining capacity and document count of every bin opened so far (at most one per item)."""

    def __init__(self, n: int, seq_len: int, max_docs: int) -> None:
        self.cap = np.full(n, seq_len, dtype=np.int64)
        self.docs = np.zeros(n, dtype=np.int64)
        self.count = 0
        self.seq_len = seq_len
        self.max_docs = max_docs

    def place(self, cand: np.ndarray, k: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """Put k items of ``length`` into the candidates in order, opening bins for the rest.

        Each candidate (all have room for one) takes as many as fit, so the last one used may be
        partly filled. New bins each take ``min(S // length, max_docs)``.

        Returns:
            (bins used in order, items each took); capacities and counts are updated.
        """
        take = np.minimum(self.cap[cand] // length, self.max_docs - self.docs[cand])
        csum = np.cumsum(take)
        j = int(np.searchsorted(csum, k))  # first candidate by which all k are placed
        if j < len(cand):
            cand, take = cand[: j + 1], take[: j + 1]
            take[j] -= int(csum[j]) - k
            rest = 0
        else:
            rest = k - (int(csum[-1]) if len(csum) else 0)
        if rest:
            per = min(self.seq_len // length, self.max_docs)
            opened = -(-rest // per)
            new_take = np.full(opened, per, dtype=np.int64)
            new_take[-1] = rest - (opened - 1) * per
            cand = np.concatenate([cand, np.arange(self.count, self.count + opened)])
            take = np.concatenate([take, new_take])
            self.count += opened
        self.cap[cand] -= take * length
        self.docs[cand] += take
        return cand, take

    def open_to(self, ids: np.ndarray, length: int) -> np.ndarray:
        """Which of ``ids`` can still take an item of ``length``."""
        room = self.cap[ids] >= length
        return room if self.max_docs > len(self.cap) else room & (self.docs[ids] < self.max_docs)


_Runs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _runs(clipped: np.ndarray, seq_len: int) -> _Runs:
    """Items by decreasing length (ties by index) and their runs: (order, length, start, count)."""
    key = seq_len - clipped
    # 16-bit keys take numpy's radix sort, several times faster than int64's (docs/design.md,
    # Measured costs).
    order = np.argsort(key.astype(np.uint16) if seq_len < 2**16 else key, kind="stable")
    ordered = clipped[order]
    starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    counts = np.diff(np.append(starts, len(ordered)))
    return order, ordered[starts], starts, counts


def _best_fit(clipped: np.ndarray, seq_len: int, max_docs: int) -> tuple[np.ndarray, int]:
    """Item-by-item BFD (smallest remaining capacity, then lowest bin id), computed per run.

    The bins that fit the current length sit on ``stack`` ordered so its top is the best fit,
    (capacity, id) ascending. A bin that drops below the current length waits in ``later[r]``
    for run r, the first run short enough for its capacity (runs decrease, capacities only
    shrink, so it never has to be re-sorted). Same bins as the per-item loop, not just as many.
    """
    order, run_len, run_start, run_count = _runs(clipped, seq_len)
    bins = _Bins(len(clipped), seq_len, max_docs)
    stack = np.empty(len(clipped), dtype=np.int64)
    top = 0
    later: list[list[np.ndarray]] = [[] for _ in range(len(run_len) + 1)]
    neg_len = -run_len  # ascending, for searchsorted
    out = np.empty(len(clipped), dtype=np.int64)
    runs = zip(run_len.tolist(), run_start.tolist(), run_count.tolist())
    for r, (length, pos, k) in enumerate(runs):
        if later[r]:
            woken = np.concatenate(later[r])
            woken = woken[np.lexsort((woken, bins.cap[woken]))][::-1]  # best fit last = top
            stack[top : top + len(woken)] = woken
            top += len(woken)
        m = min(k, top)  # every bin on the stack takes at least one item
        used, take = bins.place(stack[top - m : top][::-1], k, length)
        top -= min(m, len(used))
        out[pos : pos + k] = np.repeat(used, take)
        last = int(used[-1])
        if bins.cap[last] >= length and bins.docs[last] < max_docs:  # partly filled: still best
            stack[top] = last
            top += 1
            used = used[:-1]
        run = np.searchsorted(neg_len, -bins.cap[used])  # room 0 gives len(run_len): dropped
        if max_docs <= len(clipped):
            run[bins.docs[used] >= max_docs] = len(run_len)
        _defer(later, used, run)
    result = np.empty(len(clipped), dtype=np.int64)
    result[order] = out
    return result, bins.count


def _defer(later: list[list[np.ndarray]], ids: np.ndarray, run: np.ndarray) -> None:
    """Append each bin to ``later[run]`` (``run`` == number of runs: never fits again, dropped).

    A Python step per distinct (run, target run) pair, not per bin: ~50k steps for 1M T0 lengths
    at S=2048.
    """
    if not len(ids):
        return
    order = np.argsort(run)
    ids, run = ids[order], run[order]
    edges = [0, *(np.flatnonzero(run[1:] != run[:-1]) + 1).tolist(), len(run)]
    targets = run.tolist()
    for lo, hi in pairwise(edges):
        if targets[lo] < len(later) - 1:
            later[targets[lo]].append(ids[lo:hi])


def _first_fit(clipped: np.ndarray, seq_len: int, max_docs: int) -> tuple[np.ndarray, int]:
    """Item-by-item FFD (lowest bin id that fits), computed per run.

    Cost: a scan of the live bins per run, O(runs x bins): ~1,600 runs x <=122k bins for 1M T0
    lengths (the time: docs/design.md, Measured costs).
    """
    order, run_len, run_start, run_count = _runs(clipped, seq_len)
    bins = _Bins(len(clipped), seq_len, max_docs)
    live = np.empty(0, dtype=np.int64)  # bins that may still take an item, by id
    out = np.empty(len(clipped), dtype=np.int64)
    smallest = int(run_len[-1]) if len(run_len) else 1
    for length, pos, k in zip(run_len.tolist(), run_start.tolist(), run_count.tolist()):
        first = bins.count
        used, take = bins.place(live[bins.open_to(live, length)][:k], k, length)
        out[pos : pos + k] = np.repeat(used, take)
        live = np.concatenate([live, np.arange(first, bins.count)])
        if len(used) > 64:  # many bins changed: drop those the shortest item no longer fits
            live = live[bins.open_to(live, smallest)]
    result = np.empty(len(clipped), dtype=np.int64)
    result[order] = out
    return result, bins.count


def _pack(
    lengths: np.ndarray, seq_len: int, buffer_docs: int | None, max_docs_per_bin: int | None,
    *, best: bool,
) -> Packing:
    """Clip, pack each window of ``buffer_docs`` documents, number bins globally."""
    clipped = np.minimum(check_lengths(lengths, seq_len=seq_len), seq_len)
    for name, value in (("buffer_docs", buffer_docs), ("max_docs_per_bin", max_docs_per_bin)):
        if value is not None and int(value) < 1:
            raise EtlError(f"{name} must be at least 1 (or None for no limit), got {value}")
    max_docs = len(clipped) + 1 if max_docs_per_bin is None else int(max_docs_per_bin)
    window = len(clipped) if buffer_docs is None else min(int(buffer_docs), len(clipped))
    if 0 < window < len(clipped) and side_by_side_cheaper(clipped, seq_len, window):
        bins, total = side_by_side(clipped, seq_len, max_docs, window, best)
        return whole_examples(bins, clipped, total)
    core: _Core = _best_fit if best else _first_fit
    bins = np.empty(len(clipped), dtype=np.int64)
    total = 0
    # One core call per window: few windows here (large ones), each O(runs) Python steps.
    for lo in range(0, len(clipped), max(window, 1)):
        part, count = core(clipped[lo : lo + window], seq_len, max_docs)
        bins[lo : lo + window] = part + total
        total += count
    return whole_examples(bins, clipped, total)


def bfd(
    lengths: np.ndarray, *, seq_len: int, seed: int = 0, buffer_docs: int | None = None,
    max_docs_per_bin: int | None = None,
) -> Packing:
    """Best-fit decreasing: longest first, each into the fullest bin it fits (ties: oldest bin).

    Trade-off: the fewest bins of the whole-example packers (T0, 1M lengths at S=2048: 0.084%
    over ceil(sum / S), as many as TRL 1.16's BFD) in O(N log N) plus a Python step per run
    (the time: docs/design.md, Measured costs); examples lose their order. Windows cost bins:
    0.55% over the bound with ``buffer_docs=1000``. An example longer than ``seq_len`` counts as
    ``seq_len`` tokens (one piece of length S; the caller decides which end it keeps).

    Args:
        lengths: (N,) tokens of every example (>= 1 each).
        seq_len: S, the most tokens in a bin.
        seed: unused (no random choice; ties are broken by bin id); kept for `PackFn`.
        buffer_docs: pack each window of this many consecutive examples on its own (chomp's
            ``packing_buffer_docs``; TRL's default is 1,000); None packs the whole input at once.
        max_docs_per_bin: most examples in one bin (chomp's ``packing_max_docs_per_bin``).

    Returns:
        One piece per example; bins numbered in opening order, window after window.

    Raises:
        EtlError: when ``seq_len``, ``buffer_docs`` or ``max_docs_per_bin`` < 1 or an example
            has no tokens (empty examples are rejected, not skipped).
    """
    del seed
    return _pack(lengths, seq_len, buffer_docs, max_docs_per_bin, best=True)


def ffd(
    lengths: np.ndarray, *, seq_len: int, seed: int = 0, buffer_docs: int | None = None,
    max_docs_per_bin: int | None = None,
) -> Packing:
    """First-fit decreasing (chomp's bin packer): longest first, into the oldest bin that fits.

    Trade-off: as many bins as `bfd` on T0, but not always: [11, 7, 5, 3, 2, 2] at S=15 takes 3
    bins, BFD 2 (the 3 goes to the older, roomier bin). Each run scans the open bins,
    O(runs x bins) (docs/design.md, Measured costs). Arguments, clipping and errors as in `bfd`.
    """
    del seed
    return _pack(lengths, seq_len, buffer_docs, max_docs_per_bin, best=False)
