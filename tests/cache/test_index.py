"""`etl.cache.index`: build, extend and find give what a Python dict of the first place of every
key gives, including keys that share their first word (k0) and differ in the second (k1)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.cache import index as ix

WORD = st.sampled_from([0, 1, 7, 2**63, 2**64 - 1])  # few values: many keys share k0 (and k1)
KEY = st.tuples(WORD, WORD)
Pair = tuple[int, int]


def as_keys(pairs: list[tuple[int, int]]) -> np.ndarray:
    return np.array(pairs, dtype=np.uint64).reshape(-1, 2)


def reference(pairs: list[tuple[int, int]], places: list[tuple[int, int]]) -> dict[tuple[int, int], tuple[int, int]]:
    """key -> (segment, row) of its first occurrence."""
    ref: dict[tuple[int, int], tuple[int, int]] = {}
    for key, place in zip(pairs, places, strict=True):
        ref.setdefault(key, place)
    return ref


def check(index: ix.KeyIndex, ref: dict[tuple[int, int], tuple[int, int]], queries: list[tuple[int, int]]) -> None:
    # Sorted by (k0, k1), each key once.
    stored = list(zip(index.k0.tolist(), index.k1.tolist(), strict=True))
    assert stored == sorted(ref)
    assert index.k0.dtype == index.k1.dtype == np.uint64
    at = ix.find(index, as_keys(queries))
    for q, a in zip(queries, at.tolist(), strict=True):
        if q in ref:
            assert a != ix.MISSING
            assert (int(index.k0[a]), int(index.k1[a])) == q
            assert (int(index.seg[a]), int(index.row[a])) == ref[q]
        else:
            assert a == ix.MISSING


@settings(max_examples=200, deadline=None)
@given(pairs=st.lists(KEY, max_size=40), queries=st.lists(KEY, max_size=20), data=st.data())
def test_build_and_find_match_a_dict(pairs: list[Pair], queries: list[Pair], data: st.DataObject) -> None:
    """build keeps each key once, at its first (segment, row); find returns that place, or MISSING."""
    place = st.tuples(st.integers(0, 9), st.integers(0, 99))
    places = data.draw(st.lists(place, min_size=len(pairs), max_size=len(pairs)))
    seg = np.array([p[0] for p in places], np.int64)
    row = np.array([p[1] for p in places], np.int64)
    index = ix.build(as_keys(pairs), seg, row)
    check(index, reference(pairs, places), queries + pairs)


@settings(max_examples=150, deadline=None)
@given(first=st.lists(KEY, max_size=25), more=st.lists(KEY, max_size=25), queries=st.lists(KEY, max_size=20))
def test_extend_keeps_what_the_index_had(first: list[Pair], more: list[Pair], queries: list[Pair]) -> None:
    """extend adds new keys; a key already in the index (or twice in the new ones) keeps its first place."""
    places_a = [(1, i) for i in range(len(first))]
    places_b = [(2, i) for i in range(len(more))]
    index = ix.build(as_keys(first), np.ones(len(first), np.int64), np.arange(len(first), dtype=np.int64))
    index = ix.extend(index, as_keys(more), np.full(len(more), 2, np.int64), np.arange(len(more), dtype=np.int64))
    check(index, reference(first + more, places_a + places_b), queries + first + more)


def test_keys_sharing_the_first_word() -> None:
    """Three keys with one k0 and different k1 are three keys; a query with that k0 and another k1,
    below, between or above them, is MISSING (by hand)."""
    k0 = 2**64 - 5
    keys = as_keys([(k0, 30), (k0, 10), (5, 10), (k0, 20), (k0, 10)])
    index = ix.build(keys, np.array([0, 0, 0, 1, 1], np.int64), np.array([0, 1, 2, 3, 4], np.int64))
    assert index.k0.tolist() == [5, k0, k0, k0] and index.k1.tolist() == [10, 10, 20, 30]
    assert index.row.tolist() == [2, 1, 3, 0]  # (k0, 10): the first of its two places, row 1
    at = ix.find(index, as_keys([(k0, 10), (k0, 20), (k0, 30), (k0, 5), (k0, 15), (k0, 31), (5, 20), (6, 10)]))
    assert at.tolist() == [1, 2, 3, ix.MISSING, ix.MISSING, ix.MISSING, ix.MISSING, ix.MISSING]


def test_empty_index_and_empty_queries() -> None:
    """Nothing is found in an empty index; no queries give no answers."""
    empty = ix.empty()
    assert ix.find(empty, as_keys([(1, 2), (0, 0)])).tolist() == [ix.MISSING, ix.MISSING]
    one = ix.build(as_keys([(1, 2)]), np.zeros(1, np.int64), np.zeros(1, np.int64))
    assert ix.find(one, as_keys([])).tolist() == []
    assert ix.find(ix.extend(empty, as_keys([(1, 2)]), np.array([4]), np.array([5])), as_keys([(1, 2)])).tolist() == [0]
