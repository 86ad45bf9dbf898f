"""Token-balanced ranks: deal each global step's rows (or packs) so every rank gets B of them and
nearly the same number of real tokens.

Pure numpy over the whole epoch, a function of the epoch order and the token counts only, so
every rank computes the same assignment with no communication. Dealers sit in `BALANCERS`;
moving items between the steps of a window (before and after dealing) is in
`etl.loader.balance.regroup`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from etl.errors import EtlError
from etl.loader.balance.regroup import regroup_steps, swap_across_steps


class _BalanceFn(Protocol):
    """Signature shared by every entry of `BALANCERS`."""

    def __call__(self, costs: np.ndarray, *, world_size: int) -> np.ndarray: ...


def _deal_snake(costs: np.ndarray, *, world_size: int) -> np.ndarray:
    """Sort each step's items by tokens, deal them round by round, reversing every other round.

    Trade-off: one argsort for the whole epoch (cheap: docs/design.md, Measured costs), but the
    rank dealt first in a round keeps the larger item of every pair of rounds, so a heavy tail is
    balanced poorly (T0, B=8, W=8: mean max/min 1.66 against 3.35 undealt). Fine for mild length
    spreads.

    Args:
        costs: (steps, W * B) tokens of each step's items.
        world_size: W, the ranks dealt to.

    Returns:
        (steps, W, B) int64: the positions (into a step's row of ``costs``) each rank gets.
    """
    steps, n = costs.shape
    rounds = np.argsort(-costs, axis=1, kind="stable").reshape(steps, n // world_size, world_size)
    rounds[:, 1::2] = rounds[:, 1::2, ::-1]
    return np.ascontiguousarray(rounds.transpose(0, 2, 1))


def deal_greedy(costs: np.ndarray, *, world_size: int) -> np.ndarray:
    """Largest item first to the lightest rank that has fewer than B items (LPT with a cap).

    Trade-off: a Python loop over the W * B slots of a step (64 at W=8, B=8), each pass numpy over
    every step of the epoch at once (docs/design.md, Measured costs); much better than
    `_deal_snake` on a heavy tail (T0, B=8: mean 1.14) but never revisits a choice. Arguments as
    in `_deal_snake`.
    """
    steps, n = costs.shape
    per_rank = n // world_size
    order = np.argsort(-costs, axis=1, kind="stable")
    dealt = np.empty((steps, world_size, per_rank), dtype=np.int64)
    load = np.zeros((steps, world_size), dtype=np.float64)  # any cost dtype; exact below 2**53 tokens
    count = np.zeros((steps, world_size), dtype=np.int64)
    every, full = np.arange(steps), np.inf
    for slot in range(n):
        item = order[:, slot]
        rank = np.where(count < per_rank, load, full).argmin(axis=1)  # ties: lowest rank
        dealt[every, rank, count[every, rank]] = item
        load[every, rank] += costs[every, item]
        count[every, rank] += 1
    return dealt


def _deal_swap(
    costs: np.ndarray, *, world_size: int, rounds: int = 64, tolerance: float = 1e-3
) -> np.ndarray:
    """`deal_greedy`, then rounds of the best single swap of items between two ranks.

    A swap moving m tokens from a rank to one lighter by ``gap`` (0 < m < gap) lowers the sum of
    squared loads by 2m(gap - m); each round makes, in every step at once, the swap that lowers it
    most among those involving the step's heaviest or lightest rank (2W pairs of B x B swaps).
    Both loads stay inside the old (min, max), so no step ever gets worse. The heaviest-lightest
    pair alone is tried first (B x B swaps a step) until it stalls; steps already within
    ``tolerance`` (max/min) stop. Trade-off: many times the time of `deal_greedy` (numpy over
    every step at once, at most ``rounds`` passes a phase; docs/design.md, Measured costs), once
    an epoch, for the best balance here (T0, B=8: mean 1.10, worst 1.59 against greedy's 1.14
    and 1.60; with ``window=8``: worst 1.011, and 1.038 block-shuffled where swapping with the
    heaviest and lightest rank only left 1.13). Arguments as in `_deal_snake`.
    """
    dealt = deal_greedy(costs, world_size=world_size)
    steps, world, per_rank = dealt.shape
    chunk = max(1, _SWAP_CELLS // (2 * world * per_rank**2))  # bounds the (steps, 2W, B, B) temporaries
    # Per chunk of steps: the heaviest-lightest pair first (wide=False), then all 2W pairs.
    for first, wide in itertools.product(range(0, steps if world > 1 else 0, chunk), (False, True)):
        part = dealt[first : first + chunk]  # a view: swaps land in `dealt`
        active = np.arange(len(part))
        for _ in range(rounds):
            better, heavy, i, light, j = _best_swaps(
                costs[first : first + chunk][active], part[active], tolerance, wide
            )
            if not better.any():
                break
            s = active[better]
            kept = part[s, heavy, i]
            part[s, heavy, i] = part[s, light, j]
            part[s, light, j] = kept
            active = s  # a step with no useful swap this round has none in later rounds either
    return dealt


_SWAP_CELLS = 1 << 22  # candidate swaps evaluated at once (~32 MB of int64 per temporary)


def _best_swaps(
    costs: np.ndarray, dealt: np.ndarray, tolerance: float, wide: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each step's best swap for `_deal_swap`: (useful, heavier rank, its slot, lighter rank, its
    slot), the last four only where useful; a step within ``tolerance`` (max/min) needs none."""
    steps, world, per_rank = dealt.shape
    held = np.take_along_axis(costs, dealt.reshape(costs.shape), axis=1).reshape(dealt.shape)
    load = held.sum(axis=2)
    every = np.arange(steps)[:, None]
    hi, lo = load.argmax(axis=1)[:, None], load.argmin(axis=1)[:, None]
    if wide:
        ranks = np.broadcast_to(np.arange(world), (steps, world))
        heavy = np.concatenate([np.repeat(hi, world, axis=1), ranks], axis=1)
        light = np.concatenate([ranks, np.repeat(lo, world, axis=1)], axis=1)
    else:
        heavy, light = hi, lo
    gap = (load[every, heavy] - load[every, light])[:, :, None, None]
    moved = held[every, heavy][:, :, :, None] - held[every, light][:, :, None, :]
    gain = np.where((moved > 0) & (moved < gap), moved * (gap - moved), 0).reshape(steps, -1)
    best = gain.argmax(axis=1)
    high, low = load.max(axis=1), load.min(axis=1)
    better = (gain[every[:, 0], best] > 0) & (high > low * (1 + tolerance))
    pair, slots = np.divmod(best[better], per_rank * per_rank)
    i, j = np.divmod(slots, per_rank)
    rows = every[better, 0]
    return better, heavy[rows, pair], i, light[rows, pair], j


BALANCERS: dict[str, _BalanceFn] = {"snake": _deal_snake, "greedy": deal_greedy, "swap": _deal_swap}


# Steps regrouped when balancing is on: every T0 step (B=8, 8 ranks, padded and packed) ends
# within 1.05 with room (worst 1.042; window 4 leaves 1.049, bench/token_balance.py); rows move
# by fewer than 8 steps.
DEFAULT_WINDOW = 8


@dataclass(frozen=True)
class TokenBalance:
    """How a sampler deals a step's items to ranks: by tokens, B each, the same on every rank.

    Attributes:
        strategy: a key of `BALANCERS` (``swap``: the best balance, at the highest cost once an
            epoch; docs/design.md, Measured costs).
        window: steps whose items are regrouped before dealing (`regroup_steps`) and swapped
            after it where a step stays uneven (`swap_across_steps`); 1 keeps every step's
            items exactly as the unbalanced sampler draws them and only changes their rank
            (T0, B=8: worst step 1.59 instead of 1.01, since one long row among short ones cannot
            be dealt evenly).
    """

    strategy: str = "swap"
    window: int = DEFAULT_WINDOW

    def __post_init__(self) -> None:
        if self.strategy not in BALANCERS:
            raise EtlError(
                f"unknown token balance {self.strategy!r}; choose one of {sorted(BALANCERS)} "
                "(balance=True is TokenBalance('swap'))"
            )
        if not isinstance(self.window, (int, np.integer)) or self.window < 1:
            raise EtlError(f"TokenBalance(window=...) must be an integer >= 1 (steps), got {self.window!r}")

    def fingerprint(self) -> dict[str, Any]:
        """What a resume must find equal (the sampler's state carries it)."""
        return {"strategy": self.strategy, "window": int(self.window)}

    def deal(
        self, order: np.ndarray, costs: np.ndarray, *, batch_size: int, world_size: int, drop_last: bool
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Every rank's items of an epoch, cut into steps as `split_for_rank` cuts them.

        Args:
            order: the epoch's items (row or pack ids) in sampler order.
            costs: real tokens of every item, indexed by id (``costs[order]``).
            batch_size: B, items per rank and step.
            world_size: W.
            drop_last: drop the items that cannot fill a step; otherwise wrap the order to a
                multiple of W (as `split_for_rank` does) and deal a last, shorter step.

        Returns:
            ``(steps (S, W, B), last (W, b) or None)`` int64 item ids; a rank's batch lists its
            items in the order its window holds them (epoch order when ``window`` is 1).
        """
        per_step = batch_size * world_size
        if drop_last:
            order = order[: len(order) // per_step * per_step]
        else:  # wraps around (more than once only when there are fewer rows than ranks)
            order = np.resize(order, -(-len(order) // world_size) * world_size)
        whole = len(order) // per_step * per_step
        head = order[:whole].reshape(-1, per_step)
        head = head.ravel()[regroup_steps(costs[head], window=self.window, world_size=world_size)]
        tail = order[whole:].reshape(1, -1)
        last = self._deal_steps(tail, costs, world_size)[0] if tail.size else None
        return self._deal_steps(head, costs, world_size), last

    def _deal_steps(self, items: np.ndarray, costs: np.ndarray, world_size: int) -> np.ndarray:
        """(steps, n) item ids -> (steps, W, n / W) ids dealt by `BALANCERS[strategy]`, then
        swapped between the steps of a window where one stays uneven (`swap_across_steps`)."""
        step_costs = costs[items]
        dealt = BALANCERS[self.strategy](step_costs, world_size=world_size)
        dealt = swap_across_steps(step_costs, dealt, window=self.window)
        dealt.sort(axis=2)  # the window's order, not the dealer's (which is by size)
        return items.ravel()[dealt]

    def split(
        self,
        order: np.ndarray,
        costs: np.ndarray,
        *,
        batch_size: int,
        drop_last: bool,
        rank: int,
        world_size: int,
    ) -> list[np.ndarray]:
        """This rank's batches of `deal` (the token-balanced `split_for_rank`)."""
        steps, last = self.deal(
            order, costs, batch_size=batch_size, world_size=world_size, drop_last=drop_last
        )
        return list(steps[:, rank]) + ([] if last is None else [last[rank]])


def token_balance(balance_tokens: bool | str | None, window: int | None = None) -> TokenBalance | None:
    """The loader's ``balance`` shorthand (True: ``swap``; a name of `BALANCERS`) or its older
    ``balance_tokens`` / ``balance_window`` keywords as a `TokenBalance` or None (the window
    defaults to DEFAULT_WINDOW).

    Raises:
        EtlError: an unknown strategy, a window below 1, or a window without balancing.
    """
    if balance_tokens is None or balance_tokens is False:
        if window is not None:
            raise EtlError("balance_window regroups steps for token balancing; "
                           f"pass balance=TokenBalance(window={window!r})")
        return None
    strategy = "swap" if balance_tokens is True else str(balance_tokens)
    return TokenBalance(strategy, DEFAULT_WINDOW if window is None else window)


def imbalance(loads: np.ndarray) -> np.ndarray:
    """(steps,) max over ranks / min over ranks of (steps, W) tokens (inf where a rank has 0)."""
    low = loads.min(axis=1).astype(np.float64)
    with np.errstate(divide="ignore"):
        return np.where(low > 0, loads.max(axis=1) / np.maximum(low, 1), np.inf)


def imbalance_floor(costs: np.ndarray, *, world_size: int) -> np.ndarray:
    """(steps,) a lower bound on the max/min that any dealing of B items per rank reaches.

    The rank holding the step's largest item holds at least it plus the B - 1 smallest others,
    the rank holding the smallest at most it plus the B - 1 largest, and the mean lies between
    max and min. A floor above 1.05 means that step cannot be balanced to 5% without moving
    items between steps (``window`` > 1); below, it may still not be (the bound is not tight).

    Args:
        costs: (steps, W * B) tokens of each step's items.
        world_size: W.
    """
    ascending = np.sort(costs, axis=1).astype(np.float64)
    n = ascending.shape[1]
    others = n // world_size - 1
    mean = ascending.sum(axis=1) / world_size
    heavy = ascending[:, -1] + ascending[:, :others].sum(axis=1)
    light = ascending[:, 0] + ascending[:, n - others :].sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.maximum(np.maximum(heavy / mean, mean / light), 1.0)
