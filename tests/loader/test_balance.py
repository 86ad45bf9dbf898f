"""Token-balanced ranks, the algorithms: golden deals, partition properties, floors, samplers."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.errors import EtlError
from etl.loader.balance import (
    BALANCERS,
    TokenBalance,
    imbalance,
    imbalance_floor,
    regroup_steps,
    token_balance,
)
from etl.loader.balance.regroup import swap_across_steps
from etl.loader.samplers import EpochSampler, RandomSampler, split_for_rank


def loads(costs: np.ndarray, dealt: np.ndarray) -> np.ndarray:
    """(steps, W) tokens per rank of a (steps, W, B) deal of positions."""
    return np.take_along_axis(costs, dealt.reshape(len(costs), -1), axis=1).reshape(dealt.shape).sum(2)


def skewed(n: int, *, seed: int, seq_len: int = 2048) -> np.ndarray:
    """Lengths like chat data: median ~120, a long tail cut at S (T0: p99 ~2000)."""
    rng = np.random.default_rng(seed)
    return np.minimum(np.ceil(rng.lognormal(4.8, 1.0, n)), seq_len).astype(np.int64) + 2


def test_golden_deals_by_hand() -> None:
    costs = np.array([[7, 11, 4, 9, 8, 1]])  # W=2, B=3; sorted: 11(1) 9(3) 8(4) 7(0) 4(2) 1(5)
    # snake: rounds (1, 3), (4, 0) reversed, (2, 5): r0 = 11 + 7 + 4 = 22, r1 = 9 + 8 + 1 = 18
    assert BALANCERS["snake"](costs, world_size=2).tolist() == [[[1, 0, 2], [3, 4, 5]]]
    # greedy: 11->r0, 9->r1, 8->r1 (17), 7->r0 (18), 4->r1 (21, full), 1->r0 (19)
    assert BALANCERS["greedy"](costs, world_size=2).tolist() == [[[1, 0, 5], [3, 4, 2]]]
    # swap: gap 21 - 19 = 2, closed by moving 8 (r1) for 7 (r0): 20 / 20
    assert BALANCERS["swap"](costs, world_size=2).tolist() == [[[1, 4, 5], [3, 0, 2]]]


def test_regroup_golden() -> None:
    # 2 steps of 4 items, W=2, window 2: sorted 9 8 | 7 6 | 5 4 | 3 2 (positions), groups of W;
    # group g -> step g % 2: step 0 gets 9 8 and 5 4, step 1 gets 7 6 and 3 2.
    costs = np.array([[9, 2, 5, 7], [3, 8, 6, 4]])
    perm = regroup_steps(costs, window=2, world_size=2)
    assert costs.ravel()[perm].tolist() == [[9, 8, 5, 4], [7, 6, 3, 2]]
    assert regroup_steps(costs, window=1, world_size=2).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def best_worst_step(costs: np.ndarray) -> float:
    """Brute force, W=2, B=3, 2 steps: the lowest worst max/min of any assignment (46,200)."""
    best = np.inf
    for rest in itertools.combinations(range(1, 12), 5):
        worst = 0.0
        for step in ((0, *rest), tuple(i for i in range(1, 12) if i not in rest)):
            held = costs[list(step)]
            worst = max(worst, min(max(a, held.sum() - a) / min(a, held.sum() - a)
                                   for a in (held[[0, *p]].sum()
                                             for p in itertools.combinations(range(1, 6), 2))))
        best = min(best, worst)
    return best


@pytest.mark.parametrize("strategy", sorted(BALANCERS))
def test_window_swaps_give_a_light_item_heavy_partners(strategy: str) -> None:
    # W=2, B=3, window 2: ten items of 90-130 and one of 40. Regrouped (sorted, groups of W, group
    # g to step g % 2), step 1 holds 100 100 100 100 90 40: the rank with the 40 gets at most
    # 40 + 100 + 100 = 240 against 265 a rank on average, so no dealing of it beats 265 / 240.
    costs = np.array([100, 130, 90, 100, 100, 100, 40, 100, 130, 100, 100, 100])
    regrouped = costs.reshape(2, 6).ravel()[regroup_steps(costs.reshape(2, 6), window=2, world_size=2)]
    assert regrouped.tolist() == [[130, 130, 100, 100, 100, 100], [100, 100, 100, 100, 90, 40]]
    assert imbalance_floor(regrouped, world_size=2)[1] == pytest.approx(265 / 240)
    # Swapping across the window: the 40 gets both 130s (300), its partner rank the lightest
    # three (90 + 100 + 100 = 290): 300 / 290, the best of all 46,200 assignments.
    steps, _ = TokenBalance(strategy, window=2).deal(
        np.arange(12), costs, batch_size=3, world_size=2, drop_last=True
    )
    assert sorted(costs[steps[1]].sum(axis=1).tolist() + costs[steps[0]].sum(axis=1).tolist()) == [
        290, 300, 300, 300]
    assert imbalance(costs[steps].sum(axis=2)).max() == pytest.approx(300 / 290)
    assert best_worst_step(costs) == pytest.approx(300 / 290)


def test_window_swaps_bring_a_short_pack_within_5_percent() -> None:
    # Like T0's bfd packs: 511 packs of 2010-2048 tokens (80% full) and one short pack of 1181,
    # B=8, W=8, window 8. The rank with the short pack holds at most 1181 + 7 x 2048, another rank
    # of its step at least the mean of the 7 x 8 lightest other packs: a bound on any deal.
    rng = np.random.default_rng(0)
    costs = np.append(np.where(rng.random(511) < 0.2, rng.integers(2010, 2048, 511), 2048), 1181)
    order = rng.permutation(512)
    drawn = costs[order].reshape(8, 64)
    regrouped = drawn.ravel()[regroup_steps(drawn, window=8, world_size=8)]
    before = imbalance(loads(regrouped, BALANCERS["swap"](regrouped, world_size=8)))
    steps, _ = TokenBalance("swap", window=8).deal(
        order, costs, batch_size=8, world_size=8, drop_last=True
    )
    after = imbalance(costs[steps].sum(axis=2))
    bound = np.sort(costs[:511])[:56].sum() / 7 / (1181 + 7 * 2048)
    assert before.max() > 1.05 >= after.max() >= bound
    assert after.max() < bound * 1.001
    assert after.mean() <= before.mean()


@settings(max_examples=80, deadline=None)
@given(
    steps=st.integers(1, 7),
    world=st.integers(1, 4),
    per_rank=st.integers(1, 4),
    window=st.integers(1, 4),
    seed=st.integers(0, 1000),
    strategy=st.sampled_from(sorted(BALANCERS)),
)
def test_window_swaps_deal_every_item_once_inside_its_window(
    steps: int, world: int, per_rank: int, window: int, seed: int, strategy: str
) -> None:
    # Items of 50-100 tokens, a tenth of them 1-10 (light outliers); tolerance 0 swaps wherever
    # a window's worst step can improve.
    rng = np.random.default_rng(seed)
    n = world * per_rank
    costs = np.where(rng.random((steps, n)) < 0.1, rng.integers(1, 11, (steps, n)),
                     rng.integers(50, 101, (steps, n)))
    dealt = BALANCERS[strategy](costs, world_size=world)
    swapped = swap_across_steps(costs, dealt, window=window, tolerance=0.0)
    assert swapped.shape == (steps, world, per_rank) and swapped.dtype == np.int64
    assert (np.sort(swapped, axis=None) == np.arange(steps * n)).all()
    home = np.arange(steps)[:, None, None] // window  # a shorter last window is one window too
    assert (swapped // n // window == home).all()
    before = imbalance(loads(costs, dealt))
    after = imbalance(costs.ravel()[swapped].sum(axis=2))
    for first in range(0, steps, window):  # no window's worst step gets worse
        assert after[first : first + window].max() <= before[first : first + window].max() + 1e-12
    if window == 1 or world == 1:
        assert (swapped == dealt + np.arange(steps)[:, None, None] * n).all()


@settings(max_examples=60, deadline=None)
@given(
    steps=st.integers(1, 6),
    world=st.integers(1, 4),
    per_rank=st.integers(1, 5),
    seed=st.integers(0, 1000),
    strategy=st.sampled_from(sorted(BALANCERS)),
)
def test_every_dealer_partitions_each_step_b_per_rank(
    steps: int, world: int, per_rank: int, seed: int, strategy: str
) -> None:
    costs = np.random.default_rng(seed).integers(1, 100, size=(steps, world * per_rank))
    dealt = BALANCERS[strategy](costs, world_size=world)
    assert dealt.shape == (steps, world, per_rank)
    assert (np.sort(dealt.reshape(steps, -1), axis=1) == np.arange(world * per_rank)).all()
    # No dealing beats the floor; swap never ends worse than greedy.
    got = imbalance(loads(costs, dealt))
    assert (got >= imbalance_floor(costs, world_size=world) - 1e-9).all()
    if strategy == "swap":
        greedy = imbalance(loads(costs, BALANCERS["greedy"](costs, world_size=world)))
        assert (got <= greedy + 1e-12).all()


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 120),
    world=st.integers(1, 4),
    batch=st.integers(1, 5),
    drop_last=st.booleans(),
    window=st.integers(1, 4),
    seed=st.integers(0, 1000),
)
def test_deal_delivers_the_rows_split_for_rank_delivers(
    n: int, world: int, batch: int, drop_last: bool, window: int, seed: int
) -> None:
    # Samplers refuse a split that fills no step with drop_last; with fewer rows than ranks,
    # split_for_rank leaves a rank empty where `deal` wraps the order once more.
    n = max(n, batch * world if drop_last else world)
    rng = np.random.default_rng(seed)
    order, costs = rng.permutation(n), rng.integers(1, 50, size=n)
    balance = TokenBalance("swap", window)
    args = {"batch_size": batch, "drop_last": drop_last, "world_size": world}
    plain = [split_for_rank(order, rank=r, **args) for r in range(world)]
    dealt = [balance.split(order, costs, rank=r, **args) for r in range(world)]
    # The same batch count and sizes on every rank as without balancing, and the same rows.
    assert [[len(b) for b in r] for r in dealt] == [[len(b) for b in r] for r in plain]
    flat = Counter(int(i) for r in dealt for b in r for i in b)
    assert flat == Counter(int(i) for r in plain for b in r for i in b)
    if window == 1:  # each step keeps its rows; only their rank changes
        for step in range(len(plain[0])):
            assert sorted(np.concatenate([r[step] for r in dealt]).tolist()) == sorted(
                np.concatenate([r[step] for r in plain]).tolist()
            )


def test_balance_beats_plain_on_a_skewed_distribution() -> None:
    costs = skewed(20_000, seed=0)
    order = np.random.default_rng(1).permutation(len(costs))
    args = {"batch_size": 8, "world_size": 8, "drop_last": True}
    steps = len(costs) // 64
    plain = costs[order[: steps * 64]].reshape(steps, 8, 8)  # (step, b, rank): r takes every 8th
    before = imbalance(plain.sum(axis=1))
    per_step, _ = TokenBalance("swap", window=1).deal(order, costs, **args)
    after = imbalance(costs[per_step].sum(axis=2))
    assert after.mean() < 1.2 and before.mean() > 2
    assert np.percentile(after, 90) < np.percentile(before, 10)
    windowed, _ = TokenBalance("swap", window=8).deal(order, costs, **args)
    pooled = imbalance(costs[windowed].sum(axis=2))
    assert pooled.max() <= 1.05 and pooled.mean() < 1.01


def test_floor_says_when_a_step_cannot_be_balanced() -> None:
    # One 2048-token row among 15 of 40, B=8, W=2: the rank holding it has >= 2048 + 7 * 40.
    costs = np.array([[2048] + [40] * 15])
    floor = imbalance_floor(costs, world_size=2)
    assert floor[0] == pytest.approx((2048 + 7 * 40) / ((2048 + 15 * 40) / 2))
    dealt = BALANCERS["swap"](costs, world_size=2)
    assert imbalance(loads(costs, dealt))[0] == pytest.approx((2048 + 7 * 40) / (8 * 40))


def test_token_balance_options_and_errors() -> None:
    assert token_balance(False) is None and token_balance(None) is None
    assert token_balance(True) == TokenBalance("swap", 8)
    assert token_balance("snake", 4).fingerprint() == {"strategy": "snake", "window": 4}
    with pytest.raises(EtlError, match="choose one of"):
        token_balance("lpt")
    with pytest.raises(EtlError, match=r"pass balance=TokenBalance\(window=8\)"):
        token_balance(False, 8)
    with pytest.raises(EtlError, match=">= 1"):
        token_balance(True, 0)


def rank_batches(sampler_cls: type, world: int, **kwargs: object) -> list[list[np.ndarray]]:
    return [sampler_cls(rank=r, world_size=world, **kwargs).batches(0) for r in range(world)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_epoch_sampler_ranks_agree_and_balance(num_workers: int) -> None:
    costs = skewed(400, seed=3)
    common = {"num_rows": 400, "batch_size": 4, "seed": 7, "num_workers": num_workers}
    plain = rank_batches(EpochSampler, 4, **common)
    dealt = rank_batches(EpochSampler, 4, balance=TokenBalance(window=1), costs=costs, **common)
    for step in range(len(plain[0])):  # worker interleave keeps ranks on the same step
        assert sorted(np.concatenate([r[step] for r in dealt]).tolist()) == sorted(
            np.concatenate([r[step] for r in plain]).tolist()
        )
    mean = [imbalance(np.array([[costs[r[s]].sum() for r in ranks] for s in range(len(ranks[0]))])).mean()
            for ranks in (plain, dealt)]
    assert mean[1] < mean[0]


def test_random_sampler_deals_the_same_draws() -> None:
    costs = skewed(50, seed=4)
    common = {"num_rows": 50, "batch_size": 3, "seed": 2, "num_batches": 7}
    plain = rank_batches(RandomSampler, 2, **common)
    dealt = rank_batches(RandomSampler, 2, balance=TokenBalance("greedy", window=1), costs=costs, **common)
    for step in range(7):
        assert sorted(np.concatenate([r[step] for r in dealt]).tolist()) == sorted(
            np.concatenate([r[step] for r in plain]).tolist()
        )
        assert all(len(r[step]) == 3 for r in dealt)


def test_sampler_resume_and_fingerprint() -> None:
    costs = skewed(60, seed=5)

    def make(**kw: object) -> EpochSampler:
        return EpochSampler(60, batch_size=4, seed=1, rank=1, world_size=2, **kw)

    full = list(make(balance=TokenBalance(window=2), costs=costs))  # row-id lists
    first = make(balance=TokenBalance(window=2), costs=costs)
    head = [b for _, b in zip(range(3), first)]
    resumed = make(balance=TokenBalance(window=2), costs=costs)
    resumed.load_state_dict(first.state_dict())
    assert head + list(resumed) == full
    with pytest.raises(EtlError, match="balance_tokens"):
        make().load_state_dict(first.state_dict())
    with pytest.raises(EtlError, match="balance_tokens"):
        make(balance=TokenBalance(window=3), costs=costs).load_state_dict(first.state_dict())
    old = make().state_dict()
    del old["balance_tokens"]  # saved before the option existed: loads when it is off
    make().load_state_dict(old)
    with pytest.raises(EtlError, match="tokens of every row"):
        make(costs=costs[:10])


def test_every_dealer_takes_any_integer_or_float_costs() -> None:
    """int32 costs overflowed deal_greedy's stand-in for a full rank (an IndexError)."""
    costs = np.array([[5, 1, 4, 2, 3, 3, 9, 1]], dtype=np.int64)
    for name, deal in BALANCERS.items():
        expected = deal(costs, world_size=2)
        for dtype in (np.int32, np.uint16, np.float32):
            assert np.array_equal(deal(costs.astype(dtype), world_size=2), expected), (name, dtype)
