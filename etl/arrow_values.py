"""Arrow and numpy values built from buffers, never through pyarrow's conversions of Python or
numpy values: `pa.array`, `pa.scalar`, a compute call given a str and `ChunkedArray.to_numpy` import
pandas where it is installed (~0.2 s of a run's CPU with bytecode, ~0.85 s without) for nothing.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def numbers_of(column: pa.ChunkedArray, dtype: type[np.generic]) -> np.ndarray:
    """A numeric column without nulls as a numpy array (its buffers read, one copy at most)."""
    if column.null_count:
        return column.to_numpy()
    parts = [np.frombuffer(a.buffers()[1], dtype)[a.offset : a.offset + len(a)] for a in column.chunks]
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def string_array(values: list[str]) -> pa.StringArray:
    """Python strings as an Arrow string array."""
    data = [v.encode("utf-8") for v in values]
    offsets = np.concatenate(([0], np.cumsum([len(d) for d in data]))).astype(np.int32)
    return pa.StringArray.from_buffers(len(values), pa.py_buffer(offsets), pa.py_buffer(b"".join(data)))
