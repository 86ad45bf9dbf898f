"""etl.ingest.reader: damaged compressed files, deterministic JSON arrays, byte-sized chunks, the UTF-8 check."""

from __future__ import annotations

import gzip
import json
from contextlib import nullcontext
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.errors import EtlWarning
from etl.ingest.decompress import CorruptFile
from etl.ingest.discover import UnreadableFile, discover
from etl.ingest.lines import is_utf8
from etl.ingest.reader import read_chunks


def _source(path: Path):
    return next(s for s in discover(str(path)))


def _read(path: Path, chunk_bytes: int = 1 << 20) -> tuple[list[tuple[int, str]], str | None]:
    """(source_line, line) records read before any error, and the error (or None)."""
    out: list[tuple[int, str]] = []
    try:
        for table in read_chunks(_source(path), chunk_bytes=chunk_bytes):
            out += zip(table.column(0).to_pylist(), table.column(1).to_pylist(), strict=True)
    except UnreadableFile as exc:
        return out, str(exc)
    return out, None


def _jsonl(n: int, pad: int = 20) -> bytes:
    return b"".join(json.dumps({"i": i, "t": "x" * pad}).encode() + b"\n" for i in range(n))


def test_truncated_zstd_yields_nothing(tmp_path: Path) -> None:
    data = _jsonl(20000)  # several zstd blocks (a block is at most 128 KiB)
    comp = zstandard.ZstdCompressor().compress(data)
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(comp[: len(comp) * 2 // 3])
    with pytest.raises(CorruptFile, match="truncated zstd stream"):
        next(read_chunks(_source(path)))  # the intact prefix too: a damaged archive gives nothing


def test_corrupt_zstd_is_unreadable(tmp_path: Path) -> None:
    comp = bytearray(zstandard.ZstdCompressor().compress(_jsonl(200)))
    comp[len(comp) // 2 : len(comp) // 2 + 16] = b"\xff" * 16
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(bytes(comp))
    _, err = _read(path)
    assert err is not None
    path.write_bytes(b"not zstd at all\n")
    _, err = _read(path)
    assert err is not None


def test_good_zstd_and_gzip_multi_frame(tmp_path: Path) -> None:
    a, b = _jsonl(3), _jsonl(2)
    z = tmp_path / "z.jsonl.zst"
    z.write_bytes(zstandard.ZstdCompressor().compress(a) + zstandard.ZstdCompressor().compress(b))
    g = tmp_path / "g.jsonl.gz"
    g.write_bytes(gzip.compress(a) + gzip.compress(b))
    for path in (z, g):
        with pytest.warns(EtlWarning, match="without zstd checksums") if path == z else nullcontext():
            recs, err = _read(path, chunk_bytes=7)
        assert err is None and len(recs) == 5
        assert [n for n, _ in recs] == list(range(5))


def test_truncated_gzip_yields_nothing_whatever_the_chunk_size(tmp_path: Path) -> None:
    data = _jsonl(5000, pad=200)
    comp = gzip.compress(data)
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(comp[: len(comp) * 3 // 4])
    for chunk_bytes in (1000, 64 << 20):
        assert _read(path, chunk_bytes=chunk_bytes) == ([], "truncated gzip stream")


def _truncated_array(tmp_path: Path) -> Path:
    text = json.dumps([{"i": i, "t": "y" * 50} for i in range(3000)])
    path = tmp_path / "arr.json"
    path.write_text(text[: len(text) * 2 // 3])
    return path


def test_truncated_json_array_is_deterministic(tmp_path: Path) -> None:
    path = _truncated_array(tmp_path)
    results = [_read(path) for _ in range(4)]
    assert results[0][1] is not None
    assert all(r == results[0] for r in results)


def test_json_array_chunks_are_bounded_by_bytes_and_identical(tmp_path: Path) -> None:
    path = tmp_path / "arr.json"
    path.write_text(json.dumps([{"i": i, "t": "z" * 500} for i in range(3000)]))
    tables = list(read_chunks(_source(path), chunk_bytes=100_000))
    assert len(tables) > 5
    assert all(t.column(1).nbytes < 100_000 + 600 + 8 * t.num_rows + 64 for t in tables)
    small, _ = _read(path, chunk_bytes=100_000)
    big, _ = _read(path, chunk_bytes=64 << 20)
    assert small == big and [n for n, _ in small] == list(range(3000))


def test_parquet_chunks_are_bounded_by_bytes_and_identical(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"i": list(range(3000)), "t": ["w" * 1000] * 3000}), path)
    tables = list(read_chunks(_source(path), chunk_bytes=50_000))
    assert len(tables) > 20
    assert max(t.column(1).nbytes for t in tables) < 50_000 + 1100 + 8 * 60 + 64
    small, _ = _read(path, chunk_bytes=50_000)
    big, _ = _read(path, chunk_bytes=64 << 20)
    assert small == big and [n for n, _ in small] == list(range(3000))
    assert json.loads(small[7][1]) == {"i": 7, "t": "w" * 1000}


def test_bom_before_json_array(tmp_path: Path) -> None:
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps([{"a": 1}, {"b": 2}]).encode())
    recs, err = _read(path)
    assert err is None
    assert [json.loads(line) for _, line in recs] == [{"a": 1}, {"b": 2}]


def test_json_lines_with_long_first_line(tmp_path: Path) -> None:
    path = tmp_path / "long.json"
    first = json.dumps({"t": "q" * 100_000})
    path.write_text(first + "\n" + json.dumps({"t": "short"}) + "\n{broken\n")
    recs, err = _read(path)
    assert err is None
    assert [n for n, _ in recs] == [0, 1, 2]  # per-line records: the broken one is its own reject
    assert recs[2][1].strip() == "{broken"


def _lines_by_chunk(path: Path, **kwargs) -> list[list[tuple[int, str]]]:
    return [list(zip(t.column(0).to_pylist(), t.column(1).to_pylist(), strict=True))
            for t in read_chunks(_source(path), **kwargs)]


def test_first_bytes_sizes_only_the_first_chunk(tmp_path: Path) -> None:
    """JSONL, a JSON array and Parquet: a small first chunk, then chunk_bytes; same records."""
    rows = [{"i": i, "t": "x" * 40} for i in range(3000)]  # ~55 bytes a record
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_bytes(_jsonl(3000, pad=40))
    array = tmp_path / "b.json"
    array.write_text(json.dumps(rows))
    parquet = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    for path in (jsonl, array, parquet):
        whole = _lines_by_chunk(path, chunk_bytes=50_000)
        ramped = _lines_by_chunk(path, chunk_bytes=50_000, first_bytes=5_000)
        assert [r for chunk in ramped for r in chunk] == [r for chunk in whole for r in chunk], path
        sizes = [sum(len(line.encode()) for _, line in chunk) for chunk in ramped[:-1]]
        limits = [5_000] + [50_000] * (len(sizes) - 1)
        assert all(limit - 100 <= size <= limit + 100 for size, limit in zip(sizes, limits, strict=True)), (path, sizes)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=64), st.text(max_size=32).map(lambda t: t.encode("utf-8", "surrogatepass"))))
def test_is_utf8_agrees_with_python(block: bytes) -> None:
    """Arrow's whole-block check says what a strict decode says: overlong forms, surrogates, cut
    sequences and stray continuation bytes are invalid, any character Python encodes is valid."""
    try:
        block.decode("utf-8")
        expected = True
    except UnicodeDecodeError:
        expected = False
    assert is_utf8(block) is expected
