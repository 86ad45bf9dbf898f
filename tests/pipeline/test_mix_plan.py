"""The mixture's arithmetic (etl.mixture.shares) against hand-worked values and properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.mixture.shares import copies, source_targets

UNITS = np.array([1000.0, 200.0, 800.0])  # tokens of three sources
WEIGHTS = np.array([5.0, 3.0, 2.0])  # 50/30/20
NO_CAP = np.full(3, np.inf)


@pytest.mark.parametrize(("total", "expected"), [
    # sum: 2000 tokens reshaped: 1000, 600, 400
    ("sum", [1000.0, 600.0, 400.0]),
    # first_exhausted: the tightest units/share is 200/0.3 = 666.7: nothing repeats
    ("first_exhausted", [333.333, 200.0, 133.333]),
    # all_exhausted: the loosest is 800/0.2 = 4000: every record at least once
    ("all_exhausted", [2000.0, 1200.0, 800.0]),
])
def test_targets_by_hand(total: str, expected: list[float]) -> None:
    targets, shares = source_targets(UNITS, weights=WEIGHTS, epochs=NO_CAP, total=total)
    assert targets == pytest.approx(expected, abs=1e-3)
    assert shares == pytest.approx([0.5, 0.3, 0.2])


def test_epochs_cap_a_weighted_source_and_set_an_unweighted_one() -> None:
    targets, _ = source_targets(UNITS, weights=WEIGHTS, epochs=np.array([np.inf, 2.0, np.inf]), total="sum")
    assert targets == pytest.approx([1000.0, 400.0, 400.0])  # 600 asked of 200 tokens: capped at 2x
    targets, shares = source_targets(UNITS, weights=None, epochs=np.array([0.5, 2.5, 1.0]), total="sum")
    assert targets == pytest.approx([500.0, 500.0, 800.0])
    assert shares == pytest.approx([500 / 1800, 500 / 1800, 800 / 1800])


def test_an_empty_source_gets_nothing_and_the_others_keep_their_proportions() -> None:
    targets, shares = source_targets(np.array([0.0, 300.0, 100.0]), weights=np.array([1.0, 3.0, 1.0]),
                                     epochs=np.full(3, np.inf), total="first_exhausted")
    assert targets == pytest.approx([0.0, 300.0, 100.0]) and shares == pytest.approx([0.0, 0.75, 0.25])


def test_copies_by_hand() -> None:
    units = np.array([10, 20, 30, 40])
    draws = np.array([3, 0, 2, 1], dtype=np.uint64)  # drawn order: rows 1, 3, 2, 0
    # 2.6 x 100: every row twice (200), then 60 more: row 1 (20) + row 3 (40) = 60 exactly
    assert copies(units, draws, 260.0).tolist() == [2, 3, 2, 3]
    # 45: row 1 (20) gives 20, + row 3 gives 60: 60 is 15 off, 20 is 25 off -> take both
    assert copies(units, draws, 45.0).tolist() == [0, 1, 0, 1]
    # 25: 20 is 5 off, 60 is 35 off -> row 1 alone
    assert copies(units, draws, 25.0).tolist() == [0, 1, 0, 0]
    # 5: nothing is nearer than one row (20 is 15 off, 0 is 5 off)
    assert copies(units, draws, 5.0).tolist() == [0, 0, 0, 0]
    assert copies(units, draws, 100.0).tolist() == [1, 1, 1, 1]


@settings(max_examples=200, deadline=None)
@given(
    units=st.lists(st.integers(1, 500), min_size=1, max_size=200),
    factor=st.floats(0.0, 6.0, allow_nan=False),
    seed=st.integers(0, 2**32 - 1),
)
def test_copies_miss_the_target_by_under_one_record(units: list[int], factor: float, seed: int) -> None:
    u = np.array(units, dtype=np.int64)
    draws = np.random.default_rng(seed).integers(0, 2**63, len(u), dtype=np.uint64)
    target = factor * u.sum()
    cp = copies(u, draws, target)
    whole = int(factor)
    assert ((cp == whole) | (cp == whole + 1)).all()  # floor(f) each, one more for some
    assert abs(float(cp @ u) - target) <= u.max() / 2 + 1e-6  # the nearer side of the boundary record
    extra = np.flatnonzero(cp > whole)
    if len(extra):  # the extra copies go to a prefix of the draw order
        assert draws[extra].max() <= draws[cp == whole].min(initial=np.iinfo(np.uint64).max)
