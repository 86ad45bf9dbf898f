"""Cache segments on disk: Parquet files of (key, ids) named by the sha256 of their bytes.

A segment is built in memory, hashed, written under a temporary name and renamed into place, so
a reader never sees half a file: a crash leaves a `.tmp-*` file no reader opens, and two runs
writing the same ids write the same name. Its name is its checksum: a reader verifies the bytes
before it trusts a single id (`read_segment`), and a segment that fails is ignored, removed and
its texts tokenized again.

A text's ids are one binary value, their int32 bytes (little-endian): Parquet reads binary
without the repetition levels of a list column, and the bytes become a `large_list<int32>` with no
copy of the ids, many times faster than a list column (T0's 12M Qwen2.5 ids, 60k texts, zstd,
4,096 texts per row group: 11.4 MB on disk; the times: docs/design.md, Measured costs).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from etl.cache.guard import write_file
from etl.safe_paths import check_no_symlink

KEY0, KEY1, IDS = "k0", "k1", "ids"
SCHEMA = pa.schema([(KEY0, pa.uint64()), (KEY1, pa.uint64()), (IDS, pa.large_binary())])
COMPRESSION = "zstd"
ROW_GROUP = 4096  # texts per row group (65,536 read slower: docs/design.md, Measured costs)
ID = np.dtype("<i4")


class CorruptSegment(Exception):
    """A segment whose bytes do not match its name, or that Parquet cannot read."""


def write_segment(folder: Path, keys: np.ndarray, ids: pa.LargeListArray, root: Path | None = None) -> Path:
    """Write keys (n, 2 uint64) and their ids as one segment in `folder`; its final path.

    Raises:
        SymlinkRefused: a link below `root` (the cache's, default `folder`) on the way.
        OSError: the write failed (a full disk): no file is left behind.
    """
    table = pa.table({KEY0: keys[:, 0], KEY1: keys[:, 1], IDS: as_binary(ids)}, schema=SCHEMA)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=COMPRESSION, use_dictionary=False, row_group_size=ROW_GROUP)
    data = sink.getvalue()
    final = check_no_symlink(folder / f"{hashlib.sha256(data).hexdigest()}.parquet", root or folder)
    if final.is_file() and final.read_bytes() == data:  # another run cached the same texts
        return final
    write_file(final, data, root or folder)
    return final


def as_binary(ids: pa.LargeListArray) -> pa.LargeBinaryArray:
    """Each text's ids as one binary value: the same bytes, offsets in bytes."""
    offsets = ids.offsets.to_numpy()
    values = ids.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]].astype(ID, copy=False)
    return pa.Array.from_buffers(pa.large_binary(), len(ids), [None, pa.py_buffer((offsets - offsets[0]) * ID.itemsize),
                                                               pa.py_buffer(values)])


def as_ids(column: pa.ChunkedArray | pa.Array) -> pa.LargeListArray:
    """`as_binary` undone: the binary values' bytes read as int32 ids (the ids are not copied)."""
    binary = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = np.frombuffer(binary.buffers()[1], np.int64)[binary.offset : binary.offset + len(binary) + 1]
    data = binary.buffers()[2] or pa.py_buffer(b"")
    start, stop = int(offsets[0]), int(offsets[-1])
    values = pa.Array.from_buffers(pa.int32(), (stop - start) // ID.itemsize, [None, data.slice(start, stop - start)])
    return pa.LargeListArray.from_arrays(pa.array((offsets - start) // ID.itemsize, pa.int64()), values)


def segment_keys(path: Path) -> np.ndarray:
    """The keys of a segment, (n, 2) uint64, read without its ids (not verified: `read_segment`
    checks every key it serves again).

    Raises:
        CorruptSegment: Parquet cannot read it.
    """
    try:
        table = pq.read_table(path, columns=[KEY0, KEY1])
    except (OSError, pa.ArrowException) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise CorruptSegment(str(exc)) from exc
    return np.stack([table[KEY0].to_numpy(), table[KEY1].to_numpy()], axis=1)


def read_segment(path: Path) -> pa.Table:
    """A whole segment, after checking its bytes against the sha256 in its name.

    Raises:
        CorruptSegment: the bytes differ from the name's checksum, or Parquet cannot read them.
        FileNotFoundError: the segment was removed (another run evicted it).
    """
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != path.stem:
        raise CorruptSegment("its bytes do not match its checksum")
    try:
        table = pq.read_table(pa.BufferReader(data))
    except pa.ArrowException as exc:
        raise CorruptSegment(str(exc)) from exc
    if table.schema != SCHEMA:
        raise CorruptSegment(f"unexpected columns {table.schema.names}")
    return table
