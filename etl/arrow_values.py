"""Arrow and numpy values built from buffers, never through pyarrow's conversions of Python or
numpy values: `pa.array`, `pa.scalar`, a compute call given a str and `ChunkedArray.to_numpy` import
pandas where it is installed, for nothing (its cost: docs/design.md, Measured costs).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def numbers_of(column: pa.Array | pa.ChunkedArray, dtype: type[np.generic]) -> np.ndarray:
    """A numeric array or column without nulls as a numpy array of `dtype`, its Arrow type's own
    (its buffers read: a view of one array, one copy of a column's chunks)."""
    if column.null_count:
        return column.to_numpy()
    if isinstance(column, pa.Array):
        return np.frombuffer(column.buffers()[1], dtype)[column.offset : column.offset + len(column)]
    parts = [np.frombuffer(a.buffers()[1], dtype)[a.offset : a.offset + len(a)] for a in column.chunks]
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def empty_table(schema: pa.Schema) -> pa.Table:
    """No rows of `schema` (`Schema.empty_table` imports pandas)."""
    return pa.Table.from_batches([], schema=schema)


def string_array(values: list[str]) -> pa.StringArray:
    """Python strings as an Arrow string array."""
    data = [v.encode("utf-8") for v in values]
    offsets = np.concatenate(([0], np.cumsum([len(d) for d in data]))).astype(np.int32)
    return pa.StringArray.from_buffers(len(values), pa.py_buffer(offsets), pa.py_buffer(b"".join(data)))


def list_offsets(lists: pa.Array) -> np.ndarray:
    """The len + 1 offsets of a list or large_list array into its whole child (`lists.values`),
    int32 or int64 as stored: a view, where `lists.offsets.to_numpy()` imports pandas."""
    width = np.int64 if pa.types.is_large_list(lists.type) else np.int32
    return np.frombuffer(lists.buffers()[1], width)[lists.offset : lists.offset + len(lists) + 1]


def list_lengths(lists: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """int64 value count of each list (0 for a null list, as `pc.list_flatten` skips its values)."""
    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    lengths = np.diff(list_offsets(lists)).astype(np.int64)
    if lists.null_count:
        bits = np.unpackbits(np.frombuffer(lists.buffers()[0], np.uint8), bitorder="little")
        lengths *= bits[lists.offset : lists.offset + len(lists)]
    return lengths


def from_numpy(values: np.ndarray) -> pa.Array:
    """A 1-d numeric numpy array as an Arrow array over the same memory (no nulls); a bool one
    packed to Arrow's bits (one copy, an eighth of the size)."""
    values = np.ascontiguousarray(values)
    data = np.packbits(values, bitorder="little") if values.dtype == np.bool_ else values
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(data)])


def valid_mask(values: pa.Array) -> np.ndarray:
    """bool per element: not null (from the validity bitmap; all True without one)."""
    if not values.null_count:
        return np.ones(len(values), bool)
    bits = np.unpackbits(np.frombuffer(values.buffers()[0], np.uint8), bitorder="little")
    return bits[values.offset : values.offset + len(values)].astype(bool)


def string_offsets(texts: pa.LargeStringArray) -> np.ndarray:
    """The len + 1 int64 offsets of a large_string array into its data buffer (a view)."""
    return np.frombuffer(texts.buffers()[1], np.int64)[texts.offset : texts.offset + len(texts) + 1]
