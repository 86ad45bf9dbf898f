"""Samplers: seeded epoch orders, block locality, rank splits, worker interleave, resume."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from etl.errors import EtlError
from etl.loader.samplers import (
    EpochSampler,
    RandomSampler,
    epoch_order,
    interleave_for_workers,
    random_rows,
    split_for_rank,
)


def test_epoch_order_is_seeded_by_seed_plus_epoch() -> None:
    # The contract (seed 002): the generator of epoch e is seeded with seed + e.
    expected = np.random.default_rng(1337 + 2).permutation(100)
    assert epoch_order(100, seed=1337, epoch=2).tolist() == expected.tolist()
    assert epoch_order(100, seed=1336, epoch=3).tolist() == expected.tolist()
    assert epoch_order(100, seed=1337, epoch=3).tolist() != expected.tolist()
    assert epoch_order(5, seed=1, epoch=9, shuffle=False).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("mix", [1, 2, 3])
def test_block_shuffle_is_a_permutation_with_windows_of_mix_blocks(mix: int) -> None:
    labels = np.repeat(np.arange(7), [5, 5, 5, 5, 5, 5, 3])  # 7 row groups, the last one short
    order = epoch_order(len(labels), seed=3, epoch=1, blocks=labels, mix=mix)
    assert sorted(order.tolist()) == list(range(len(labels)))
    counts = Counter(labels.tolist())
    pos, seen, windows = 0, set(), 0
    while pos < len(order):  # walk the order window by window
        window, remaining = set(), 0
        while True:
            block = int(labels[order[pos]])
            if block not in window:
                assert block not in seen, "a block was split across windows"
                assert len(window) < mix, "a window mixed more than `mix` blocks"
                window.add(block)
                remaining += counts[block]
            remaining, pos = remaining - 1, pos + 1
            if pos == len(order) or (remaining == 0 and len(window) == mix):
                break
        seen |= window
        windows += 1
    assert windows == -(-7 // mix)


def test_block_shuffle_int_blocks_bound_row_groups_per_batch() -> None:
    order = epoch_order(64, seed=0, epoch=0, blocks=16, mix=2)
    for start in range(0, 64, 8):  # batches of 8 inside windows of 32 rows
        assert len(set((order[start : start + 8] // 16).tolist())) <= 2
    assert sorted(order.tolist()) == list(range(64))


def test_split_for_rank_golden() -> None:
    order = np.arange(10)
    # W=2, B=2, drop_last: 10 // 4 * 4 = 8 rows used; rank r takes order[r::2].
    assert [
        b.tolist()
        for b in split_for_rank(order, batch_size=2, drop_last=True, rank=0, world_size=2)
    ] == [[0, 2], [4, 6]]
    assert [
        b.tolist()
        for b in split_for_rank(order, batch_size=2, drop_last=True, rank=1, world_size=2)
    ] == [[1, 3], [5, 7]]
    # W=3, no drop_last: padded by wrapping to 12 rows; every rank gets 4 rows in 2 batches.
    got = [
        [
            b.tolist()
            for b in split_for_rank(order, batch_size=3, drop_last=False, rank=r, world_size=3)
        ]
        for r in range(3)
    ]
    assert got == [[[0, 3, 6], [9]], [[1, 4, 7], [0]], [[2, 5, 8], [1]]]


def test_interleave_gives_each_worker_a_contiguous_chunk() -> None:
    order = interleave_for_workers(7, 3)  # chunks [0,1,2] [3,4] [5,6]
    assert order.tolist() == [0, 3, 5, 1, 4, 6, 2]
    for w in range(3):  # DataLoader sends batch k to worker k % 3
        assert order[w::3].tolist() == np.array_split(np.arange(7), 3)[w].tolist()
    assert interleave_for_workers(4, 0).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("n", "b", "w", "drop_last"),
    [(103, 8, 1, True), (103, 8, 1, False), (103, 4, 3, True), (102, 5, 3, False)],
)
def test_epoch_sampler_coverage_and_equal_counts(n: int, b: int, w: int, drop_last: bool) -> None:
    samplers = [
        EpochSampler(n, batch_size=b, seed=5, drop_last=drop_last, rank=r, world_size=w)
        for r in range(w)
    ]
    batches = [list(s) for s in samplers]
    assert len({len(bs) for bs in batches}) == 1  # equal batch counts on every rank
    rows = [i for bs in batches for batch in bs for i in batch]
    if drop_last:
        assert len(rows) == len(set(rows)) == n // (b * w) * b * w
        assert all(len(batch) == b for bs in batches for batch in bs)
    else:  # n divisible by w here or padded: every row at least once, fewer than w repeats
        assert set(rows) == set(range(n))
        assert len(rows) - n < w


def test_epoch_sampler_advances_epochs_and_resumes_at_the_next_batch() -> None:
    s = EpochSampler(40, batch_size=4, seed=11, num_workers=2)
    epoch0, epoch1 = list(s), list(s)
    assert s.epoch == 2 and epoch0 != epoch1
    assert sorted(i for b in epoch1 for i in b) == list(range(40))
    fresh = EpochSampler(40, batch_size=4, seed=11, num_workers=2)
    it = iter(fresh)
    first = [next(it) for _ in range(3)]
    state = fresh.state_dict()
    resumed = EpochSampler(40, batch_size=4, seed=11, num_workers=2)
    resumed.load_state_dict(state)
    assert first + list(resumed) == epoch0
    assert list(resumed) == epoch1  # and the next epoch follows


def test_load_state_dict_refuses_other_settings() -> None:
    state = EpochSampler(40, batch_size=4, seed=1).state_dict()
    with pytest.raises(EtlError, match="batch_size: now 8, saved 4"):
        EpochSampler(40, batch_size=8, seed=1).load_state_dict(state)


def test_random_sampler_with_replacement_deterministic_and_rank_distinct() -> None:
    a = list(RandomSampler(10, batch_size=6, seed=4, num_batches=50))
    assert a == list(RandomSampler(10, batch_size=6, seed=4, num_batches=50))
    rows = np.array(a)
    assert rows.min() >= 0 and rows.max() < 10 and rows.shape == (50, 6)
    assert any(len(set(batch)) < len(batch) for batch in a)  # drawn with replacement
    assert sorted(set(rows.ravel().tolist())) == list(range(10))
    r0 = random_rows(10, seed=4, epoch=0, num_batches=3, batch_size=6, rank=0, world_size=2)
    r1 = random_rows(10, seed=4, epoch=0, num_batches=3, batch_size=6, rank=1, world_size=2)
    assert r0.tolist() != r1.tolist()
    s = RandomSampler(10, batch_size=6, seed=4, num_batches=50)
    it = iter(s)
    head = [next(it) for _ in range(7)]
    resumed = RandomSampler(10, batch_size=6, seed=4, num_batches=50)
    resumed.load_state_dict(s.state_dict())
    assert head + list(resumed) == a


def test_sampler_errors() -> None:
    with pytest.raises(EtlError, match="drop_last=False"):
        EpochSampler(5, batch_size=4, world_size=2)
    with pytest.raises(EtlError, match="outside world_size"):
        EpochSampler(50, batch_size=4, rank=2, world_size=2)
    with pytest.raises(EtlError, match="no rows"):
        RandomSampler(0, batch_size=4)
