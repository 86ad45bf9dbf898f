"""Token-balanced ranks across steps: move items between the steps of a window of k steps so that
each step's items deal evenly (`regroup_steps` before dealing, `swap_across_steps` after).

Both are numpy over every window at once and a function of the costs only (no communication);
an item never leaves its window, so a row moves by fewer than k steps. Used by `TokenBalance`.
"""

from __future__ import annotations

import numpy as np


def regroup_steps(costs: np.ndarray, *, window: int, world_size: int) -> np.ndarray:
    """A permutation that moves items between the steps of each window of ``window`` steps.

    The window's items are sorted by tokens and cut into groups of W alike items; group g goes to
    step g mod k of the window, so step 0 gets the W longest items, step 1 the next W, and so on
    round the window. Every step then holds B groups of near-equal items, which any dealer
    balances across ranks, whereas a step drawn at random may hold one 2048-token row among short
    ones, which no dealing balances at small B. Trade-off: one argsort of the epoch (cheap:
    docs/design.md, Measured costs), but a row moves by fewer than ``window`` steps, a step's rows
    are no longer a uniform draw (each step is a stratified sample of its window: the W longest
    rows of a window land in one step), and tokens per step vary more (T0, B=8, W=8, window 8:
    coefficient of variation 0.29 against 0.15). An item far lighter than its group (bfd's one
    short pack on T0, 1,181 tokens among packs of 2,010-2,048) still leaves its step uneven
    (1.053): that is `swap_across_steps`'s job. A last window of fewer steps is regrouped alone.

    Args:
        costs: (steps, W * B) tokens of each step's items, in epoch order.
        window: steps per window; 1 leaves every step as drawn.
        world_size: W.

    Returns:
        (steps, W * B) int64 positions into ``costs.ravel()``: row j is step j's items.
    """
    steps, n = costs.shape
    perm = np.arange(steps * n, dtype=np.int64).reshape(steps, n)
    for first, last, k in _windows(steps, window):
        block = perm[first:last].reshape(-1, k * n)
        sorted_ = np.argsort(-costs[first:last].reshape(-1, k * n), axis=1, kind="stable")
        group = np.arange(k * n) // world_size
        mine = sorted_[:, np.argsort(group % k, kind="stable")]
        perm[first:last] = np.take_along_axis(block, mine, axis=1).reshape(-1, n)
    return perm


def swap_across_steps(
    costs: np.ndarray,
    dealt: np.ndarray,
    *,
    window: int,
    rounds: int | None = None,
    tolerance: float = 1e-2,
) -> np.ndarray:
    """A deal of every step, improved by swapping items with the other steps of its window.

    In each window whose worst step (max/min tokens over ranks) is above 1 + ``tolerance``, each
    round makes one swap of items between the worst step's heaviest or lightest rank and a rank of
    another step of the window: of the swaps that leave the worst step at or below its max/min and
    the other step strictly below it, the one that most lowers the sum over the two steps of the
    squared coefficient of variation of rank loads. So the rank of an item far lighter than the
    rest (a short last pack, a few tiny rows) collects the window's heaviest items, the other
    ranks of its step its lightest ones, and no window's worst step ever gets worse (T0 packed
    bfd, window 8: 1.053 -> 1.042, the best any deal of that window reaches: the short pack with
    the 7 heaviest packs, the 56 lightest on the other 7 ranks). Trade-off: 2 x B x (k x W x B)
    candidate swaps a window and round (8,192 at B=8, W=8, k=8), numpy over the windows still
    uneven at once; real data leaves few windows uneven after the dealer (T0: 1 of 14 packed,
    50 rounds; 1-2 of 108 padded), so it is cheap there, but where every window is (packs with 1%
    short ones) it costs far more, once an epoch (docs/design.md, Measured costs).

    Args:
        costs: (steps, W * B) tokens of each step's items, steps as regrouped.
        dealt: (steps, W, B) positions into a step's row of ``costs`` each rank gets (a dealer's).
        window: steps per window, as in `regroup_steps`; items never leave their window.
        rounds: at most this many swaps a window (default W x B, a step's items: enough to
            swap every item of an outlier's step once).
        tolerance: windows whose worst step is within it are left as dealt.

    Returns:
        (steps, W, B) int64 positions into ``costs.ravel()``: step j, rank r's items.
    """
    steps, world, per_rank = dealt.shape
    flat = dealt + np.arange(steps, dtype=np.int64)[:, None, None] * (world * per_rank)
    rounds = world * per_rank if rounds is None else rounds
    flat_costs = costs.ravel().astype(np.promote_types(costs.dtype, np.int64), copy=False)  # signed
    for first, last, k in _windows(steps, window if world > 1 else 1):
        part = flat[first:last].reshape(-1, k, world, per_rank)  # a view: swaps land in `flat`
        chunk = max(1, _CROSS_CELLS // (2 * k * (world * per_rank) * per_rank))
        for start in range(0, len(part), chunk):
            _swap_windows(flat_costs, part[start : start + chunk], rounds, tolerance)
    return flat


# Candidate swaps at once: 512 KB temporaries, faster than 8 MB ones (docs/design.md,
# Measured costs).
_CROSS_CELLS = 1 << 16


def _windows(steps: int, window: int) -> list[tuple[int, int, int]]:
    """(first step, end step, steps a window) of the whole windows, then of the last, shorter one;
    only those of more than one step."""
    whole = steps // window * window
    spans = ((0, whole, window), (whole, steps, steps - whole))
    return [(first, last, k) for first, last, k in spans if k > 1 and last > first]


def _swap_windows(costs: np.ndarray, part: np.ndarray, rounds: int, tolerance: float) -> None:
    """`swap_across_steps` on (windows, k, W, B) positions into ``costs``, in place."""
    load = costs[part].sum(axis=3)
    active = np.flatnonzero(_ratio(load.max(axis=2), load.min(axis=2)).max(axis=1) > 1 + tolerance)
    for _ in range(rounds):
        if not active.size:
            break
        better, moves = _best_cross_swaps(costs[part[active]], tolerance)
        w = active[better]
        here, there = (w, *moves[:3]), (w, *moves[3:])
        kept = part[here]
        part[here] = part[there]
        part[there] = kept
        active = w  # a window with no useful swap this round has none in later rounds either


def _ratio(high: np.ndarray, low: np.ndarray) -> np.ndarray:
    """max/min loads: inf where the lightest rank has 0 tokens and another has some, 1 if none."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(low > 0, high / low, np.where(high > 0, np.inf, 1.0))


def _rank_stats(load: np.ndarray) -> tuple[np.ndarray, ...]:
    """For (windows, k, W) loads: the max and the min of every rank's step without that rank
    (windows, k, W), and every step's max and min (windows, k)."""
    ordered = np.sort(load, axis=2)
    ranks = np.arange(load.shape[2])
    top = ranks == load.argmax(axis=2)[..., None]
    bottom = ranks == load.argmin(axis=2)[..., None]
    return (np.where(top, ordered[..., -2:-1], ordered[..., -1:]),
            np.where(bottom, ordered[..., 1:2], ordered[..., :1]), ordered[..., -1], ordered[..., 0])


def _after(
    load: np.ndarray,
    others: tuple[np.ndarray, np.ndarray],
    step: tuple[np.ndarray, np.ndarray],
    delta: np.ndarray,
    limit: tuple[np.ndarray, np.ndarray],
    *,
    strict: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """A step once a rank's load (``load``) changes by ``delta``: whether its max/min stays at or
    below (``strict``: below) ``limit`` (max, min), in integers, and its sum of squared loads over
    its sum squared (W x that - 1 is the squared coefficient of variation). ``others``: the max and
    min of its other ranks; ``step``: its loads' sum of squares and sum; all broadcast together."""
    new = load + delta
    high, low = np.maximum(new, others[0]) * limit[1], np.minimum(new, others[1]) * limit[0]
    squares, total = step
    return (high < low if strict else high <= low), (
        (squares + delta * (2 * load + delta)) / np.maximum(total + delta, 1) ** 2)


def _best_cross_swaps(
    held: np.ndarray, tolerance: float
) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Each window's best swap for `swap_across_steps` from (windows, k, W, B) tokens: (useful,
    (worst step, its rank, slot, other step, its rank, slot) of the useful ones)."""
    windows, k, world, per_rank = held.shape
    load = held.sum(axis=3)
    other_high, other_low, high, low = _rank_stats(load)
    squares, total = (load.astype(np.float64) ** 2).sum(axis=2), load.sum(axis=2, dtype=np.float64)
    every = np.arange(windows)
    worst = _ratio(high, low).argmax(axis=1)
    mine = np.stack([load[every, worst].argmax(axis=1), load[every, worst].argmin(axis=1)], axis=1)
    at = (every[:, None], worst[:, None], mine)  # (windows, 2): the worst step's heaviest, lightest

    def ours(x: np.ndarray) -> np.ndarray:  # (windows[, 2]) -> (windows, 2 | 1, 1, 1, 1, 1)
        return x.reshape(x.shape + (1,) * (6 - x.ndim))

    def theirs(x: np.ndarray) -> np.ndarray:  # (windows, k[, W]) -> (windows, 1, 1, k, W | 1, 1)
        return x[:, None, None, :, :, None] if x.ndim == 3 else x[:, None, None, :, None, None]

    # (windows, 2, B, k, W, B): item i of our rank for item j of rank r of step t; ours gains delta
    delta = held[:, None, None] - ours(held[at])
    limit = (ours(high[every, worst]), ours(low[every, worst]))
    fits, share = _after(ours(load[at]), (ours(other_high[at]), ours(other_low[at])),
                         (ours(squares[every, worst]), ours(total[every, worst])), delta, limit,
                         strict=False)
    fits_t, share_t = _after(theirs(load), (theirs(other_high), theirs(other_low)),
                             (theirs(squares), theirs(total)), -delta, limit, strict=True)
    before = squares / np.maximum(total, 1) ** 2
    gain = share - ours(before[every, worst]) + share_t - theirs(before)
    fits &= fits_t & (theirs(np.arange(k)[None]) != ours(worst))
    fits &= ours(_ratio(high[every, worst], low[every, worst]) > 1 + tolerance)
    gain = np.where(fits, gain, 0.0).reshape(windows, -1)
    best = gain.argmin(axis=1)
    better = gain[every, best] < -1e-14  # float noise on sums of squares is ~1e-17 here
    side, i, t, r, j = np.unravel_index(best[better], (2, per_rank, k, world, per_rank))
    rows = every[better]
    return better, (worst[rows], mine[rows, side], i, t, r, j)
