"""Gathering ids back to every row: `encoder.gather` against pyarrow's own `take`, and
`ragged.gather_pieces` against plain numpy slicing."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.cache.encoder import gather
from etl.ragged import gather_pieces, range_gather

LIST = pa.large_list(pa.int32())
ROWS = st.lists(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=5), max_size=8)


@st.composite
def sources_and_picks(draw: st.DrawFn) -> tuple[list[pa.LargeListArray], np.ndarray, np.ndarray]:
    """1-4 id arrays (some sliced, some empty) and random (source, row) picks among their rows."""
    sources = []
    for _ in range(draw(st.integers(1, 4))):
        rows = draw(ROWS)
        arr = pa.array(rows, LIST)
        start = draw(st.integers(0, len(rows)))
        sources.append(arr.slice(start) if draw(st.booleans()) else arr)
    choices = [(s, r) for s, src in enumerate(sources) for r in range(len(src))]
    picks = draw(st.lists(st.sampled_from(choices), max_size=20)) if choices else []
    source = np.array([p[0] for p in picks], np.int64)
    row = np.array([p[1] for p in picks], np.int64)
    return sources, source, row


@settings(max_examples=200, deadline=None)
@given(case=sources_and_picks())
def test_gather_equals_pyarrow_take(case: tuple[list[pa.LargeListArray], np.ndarray, np.ndarray]) -> None:
    """gather(sources, source, row)[i] == sources[source[i]][row[i]], as pyarrow's take of the
    concatenated sources gives it, as a large_list<int32>."""
    sources, source, row = case
    starts = np.cumsum([0] + [len(s) for s in sources])
    expected = pa.concat_arrays(sources).take(pa.array(starts[source] + row, pa.int64()))
    got = gather(sources, source, row)
    assert got.type == LIST
    assert len(got) == len(row)
    assert got.to_pylist() == expected.to_pylist()


def test_gather_by_hand() -> None:
    """Two sources, repeats and reversed order (by hand)."""
    a = pa.array([[1, 2], [], [3]], LIST)
    b = pa.array([[9], [8, 7, 6]], LIST).slice(1)
    got = gather([a, b], np.array([1, 0, 0, 1, 0]), np.array([0, 2, 0, 0, 1]))
    assert got.to_pylist() == [[8, 7, 6], [3], [1, 2], [8, 7, 6], []]


def test_gather_one_source_in_order_is_that_source() -> None:
    """One source read in order (or row None) is returned as it is."""
    a = pa.array([[1], [2, 3]], LIST)
    assert gather([a], np.zeros(2, np.int64), None) is a
    assert gather([a], np.zeros(2, np.int64), np.arange(2)) is a
    assert gather([a], np.zeros(3, np.int64), np.array([1, 1, 0])).to_pylist() == [[2, 3], [2, 3], [1]]


@settings(max_examples=150, deadline=None)
@given(data=st.data(), sizes=st.lists(st.integers(0, 30), min_size=1, max_size=4))
def test_gather_pieces_equals_slicing(data: st.DataObject, sizes: list[int]) -> None:
    """gather_pieces == the concatenation of sources[k][start:start+length] for every piece, in
    order (pieces of any source, any length including 0, repeats allowed); range_gather == the
    concatenated aranges."""
    sources = [np.arange(100 * k, 100 * k + n, dtype=np.int32) for k, n in enumerate(sizes)]
    pieces = []
    for _ in range(data.draw(st.integers(0, 8))):
        k = data.draw(st.integers(0, len(sources) - 1))
        start = data.draw(st.integers(0, sizes[k]))
        pieces.append((k, start, data.draw(st.integers(0, sizes[k] - start))))
    src = np.array([p[0] for p in pieces], np.int64)
    start = np.array([p[1] for p in pieces], np.int64)
    length = np.array([p[2] for p in pieces], np.int64)
    expected = [int(v) for k, s, n in pieces for v in sources[k][s : s + n]]
    assert gather_pieces(sources, src, start, length).tolist() == expected
    ranges = [int(v) for _, s, n in pieces for v in range(s, s + n)]
    assert range_gather(start, length).tolist() == ranges
