"""`etl.arrow_values`: values read from Arrow buffers equal pyarrow's own conversions."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given
from hypothesis import strategies as st

from etl.arrow_values import list_lengths, numbers_of, string_array

LISTS = st.lists(st.one_of(st.none(), st.lists(st.text(max_size=3), max_size=4)), max_size=30)


@given(LISTS, st.integers(0, 5), st.booleans())
def test_list_lengths_are_pyarrows_with_nulls_as_zero(rows: list, start: int, large: bool) -> None:
    lists = pa.array(rows, pa.large_list(pa.string()) if large else pa.list_(pa.string())).slice(start)
    want = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
    assert list_lengths(lists).tolist() == want.tolist()
    assert list_lengths(pa.chunked_array([lists, lists], lists.type)).tolist() == want.tolist() * 2
    assert int(list_lengths(lists).sum()) == len(pc.list_flatten(lists))


def test_numbers_and_strings() -> None:
    column = pa.chunked_array([pa.array([1, 2], pa.int64()), pa.array([3], pa.int64()).slice(0)])
    assert numbers_of(column, np.int64).tolist() == [1, 2, 3]
    assert string_array(["a", "", "数据"]).to_pylist() == ["a", "", "数据"]
