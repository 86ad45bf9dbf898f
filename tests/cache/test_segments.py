"""`etl.cache.segments`: ids survive the binary round trip, a segment is named by the sha256 of its
bytes, is written whole or not at all, and any damage is caught before an id is served."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.cache.segments import (
    IDS,
    KEY0,
    KEY1,
    CorruptSegment,
    as_binary,
    as_ids,
    read_segment,
    segment_keys,
    write_segment,
)

LIST = pa.large_list(pa.int32())
ID = st.integers(-(2**31), 2**31 - 1)


def ids_array(rows: list[list[int]]) -> pa.LargeListArray:
    return pa.array(rows, LIST)


def sample(n: int = 5) -> tuple[np.ndarray, pa.LargeListArray]:
    keys = np.array([[i * 3 + 1, 2**64 - 1 - i] for i in range(n)], np.uint64)
    ids = ids_array([list(range(i, i + i % 4)) for i in range(n)])
    return keys, ids


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(st.lists(ID, max_size=6), max_size=12), start=st.integers(0, 12), stop=st.integers(0, 12))
def test_binary_round_trip(rows: list[list[int]], start: int, stop: int) -> None:
    """as_ids(as_binary(x)) == x for any lists of int32 (empty lists, zero rows, extremes), also
    for a slice of a larger array; each binary value holds exactly the row's little-endian int32 bytes."""
    whole = ids_array(rows)
    start = min(start, len(rows))
    part = whole.slice(start, max(0, min(stop, len(rows)) - start))
    binary = as_binary(part)
    assert binary.type == pa.large_binary() and len(binary) == len(part)
    assert binary.to_pylist() == [np.array(r, "<i4").tobytes() for r in part.to_pylist()]
    back = as_ids(binary)
    assert back.type == LIST
    assert back.to_pylist() == part.to_pylist()
    # A binary slice and a chunked column come back too.
    if len(binary) > 1:
        assert as_ids(binary.slice(1)).to_pylist() == part.to_pylist()[1:]
    assert as_ids(pa.chunked_array([binary], pa.large_binary())).to_pylist() == part.to_pylist()


def test_zero_rows_round_trip() -> None:
    """No texts: an empty binary array, and back an empty list array."""
    empty = ids_array([])
    assert as_binary(empty).to_pylist() == []
    assert as_ids(as_binary(empty)).to_pylist() == []
    assert as_ids(pa.array([], pa.large_binary())).to_pylist() == []


def test_segment_is_named_by_its_sha256_and_reads_back(tmp_path: Path) -> None:
    """The file's name is the sha256 of its bytes; read_segment gives the keys and ids written."""
    keys, ids = sample()
    path = write_segment(tmp_path, keys, ids)
    assert path.parent == tmp_path and path.suffix == ".parquet"
    assert path.stem == hashlib.sha256(path.read_bytes()).hexdigest()
    table = read_segment(path)
    assert table[KEY0].to_pylist() == keys[:, 0].tolist()
    assert table[KEY1].to_pylist() == keys[:, 1].tolist()
    assert as_ids(table[IDS]).to_pylist() == ids.to_pylist()
    assert segment_keys(path).tolist() == keys.tolist()
    # An ordinary Parquet reader sees the same rows (nothing etl-specific in the file).
    assert pq.read_table(path).num_rows == len(keys)


def test_same_data_twice_is_one_file_and_no_temporary_left(tmp_path: Path) -> None:
    """Writing the same keys and ids twice gives the same name and leaves one file, no `.tmp-*`."""
    keys, ids = sample()
    first = write_segment(tmp_path, keys, ids)
    stamp = first.stat().st_mtime_ns
    second = write_segment(tmp_path, keys, ids)
    assert first == second
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]
    assert first.stat().st_mtime_ns == stamp  # not rewritten
    other = write_segment(tmp_path, keys[:2], ids.slice(0, 2))
    assert other != first
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, other.name])
    assert not list(tmp_path.glob(".tmp-*"))


def test_empty_segment(tmp_path: Path) -> None:
    """A segment of zero texts is a valid segment too."""
    path = write_segment(tmp_path, np.zeros((0, 2), np.uint64), ids_array([]))
    assert read_segment(path).num_rows == 0 and segment_keys(path).shape == (0, 2)


@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_flipped_byte_is_corrupt(tmp_path: Path, where: str) -> None:
    """One flipped byte anywhere: read_segment raises CorruptSegment (the checksum catches it)."""
    path = write_segment(tmp_path, *sample(50))
    data = bytearray(path.read_bytes())
    at = {"start": 0, "middle": len(data) // 2, "end": len(data) - 1}[where]
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptSegment):
        read_segment(path)


def test_truncated_is_corrupt(tmp_path: Path) -> None:
    """A segment cut short (a crash, a full disk): CorruptSegment, for read_segment and segment_keys."""
    path = write_segment(tmp_path, *sample(50))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(CorruptSegment):
        read_segment(path)
    with pytest.raises(CorruptSegment):
        segment_keys(path)


def test_right_checksum_but_not_a_segment(tmp_path: Path) -> None:
    """A file whose name matches its bytes but is not a readable segment: still CorruptSegment
    (garbage, or Parquet with other columns)."""
    junk = b"not parquet at all"
    path = tmp_path / f"{hashlib.sha256(junk).hexdigest()}.parquet"
    path.write_bytes(junk)
    with pytest.raises(CorruptSegment):
        read_segment(path)
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"x": [1, 2]}), sink)
    data = sink.getvalue().to_pybytes()
    other = tmp_path / f"{hashlib.sha256(data).hexdigest()}.parquet"
    other.write_bytes(data)
    with pytest.raises(CorruptSegment):
        read_segment(other)


def test_missing_segment_is_not_corrupt(tmp_path: Path) -> None:
    """A segment removed meanwhile (another run evicted it) raises FileNotFoundError, not CorruptSegment."""
    path = tmp_path / ("0" * 64 + ".parquet")
    with pytest.raises(FileNotFoundError):
        read_segment(path)
    with pytest.raises(FileNotFoundError):
        segment_keys(path)
