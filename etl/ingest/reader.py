"""Find input files and stream them as bounded chunks of raw JSON records.

Every chunk is an Arrow table `(source_line int64, line large_string)`: one JSON text per
record, whatever the file type, so one vectorized parser (`etl.formats.registry`) validates them all.
JSONL is split on newlines with numpy over a byte block (zero-copy strings); JSON arrays and
Parquet go through DuckDB / pyarrow batch readers. Memory is bounded by `chunk_bytes`.
"""

from __future__ import annotations

import glob
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.columns import INVALID_UTF8
from etl.config.run_config import DEFAULT_CHUNK_BYTES
from etl.errors import EtlError

KINDS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet"}
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
Progress = Callable[[int], None]
RAW_SCHEMA = pa.schema([("source_line", pa.int64()), ("line", pa.large_string())])


@dataclass(frozen=True)
class Source:
    """One input: its path, the name written to `source_file`, its kind and compression.

    Kind `dir` is a folder under SRC that could not be listed (`error` says why): the run counts
    it as a rejected record (`unreadable_dir`) instead of skipping what it holds unseen.
    """

    path: Path
    name: str
    kind: str
    compression: str | None
    error: str | None = None


class UnreadableFile(Exception):
    """A whole file (or the rest of it) could not be parsed; the run records it and goes on."""

    reason = "unreadable_file"


class UnreadableDir(UnreadableFile):
    """A folder under SRC could not be listed: whatever it holds is counted as one reject."""

    reason = "unreadable_dir"


def classify(path: Path) -> tuple[str, str | None] | None:
    """(kind, compression) from the file name, or None for files that are not input."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = COMPRESSIONS.get(suffixes[-1]) if suffixes else None
    if compression:
        suffixes = suffixes[:-1]
    kind = KINDS.get(suffixes[-1]) if suffixes else None
    return (kind, compression) if kind else None


def _glob_base(pattern: str) -> Path:
    """The directory a glob's matches are named relative to: its leading non-magic parts."""
    parts = Path(pattern).parts
    fixed = []
    for part in parts[:-1]:
        if glob.has_magic(part):
            break
        fixed.append(part)
    return Path(*fixed) if fixed else Path(".")


def source_root(src: str) -> Path:
    """The folder SRC's files are named relative to: SRC itself, a file's folder, a glob's base."""
    root = Path(src)
    if root.is_dir():
        return root
    return root.parent if root.is_file() else _glob_base(src)


def _hidden(part: str) -> bool:
    return part.startswith((".", "_")) and part not in (".", "..")


def _walk(root: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Files under root (symlinked folders followed, as `rglob` did) and the folders that could
    not be listed, with why. Hidden and underscore-prefixed folders are not entered."""
    if not os.access(root, os.R_OK | os.X_OK):
        raise EtlError(f"cannot read the input folder {root} (permission denied); check its permissions")
    files: list[Path] = []
    unreadable: list[tuple[Path, str]] = []

    def failed(exc: OSError) -> None:
        unreadable.append((Path(exc.filename or root), exc.strerror or str(exc)))

    for folder, dirs, names in os.walk(root, onerror=failed, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not _hidden(d))
        files += [Path(folder) / n for n in names if (Path(folder) / n).is_file()]
    return files, unreadable


def discover(src: str) -> list[Source]:
    """Input files of SRC (a file, a directory searched recursively, or a glob), sorted.

    Names are relative to SRC's directory (for a glob, its non-magic prefix directory), so
    a directory and a glob over it name files alike. A path with a hidden or underscore-
    prefixed part below that base (`.ipynb_checkpoints/`, `_old/`, `.x.jsonl`) is skipped.
    A folder under a directory SRC that cannot be listed is a `Source` of kind `dir`.
    """
    root = Path(src)
    unreadable: list[tuple[Path, str]] = []
    if root.is_file():
        candidates, base = [root], root.parent
    elif root.is_dir():
        (candidates, unreadable), base = _walk(root), root
    else:
        base = _glob_base(src)
        candidates = [Path(p) for p in glob.glob(src, recursive=True) if Path(p).is_file()]
    sources = [Source(path=p, name=_name(p, base) + "/", kind="dir", compression=None, error=why)
               for p, why in unreadable]
    for path in sorted(candidates):
        kind = classify(path)
        if kind is None:
            continue
        name = _name(path, base)
        if any(_hidden(part) for part in Path(name).parts):
            continue
        sources.append(Source(path=path, name=name, kind=kind[0], compression=kind[1]))
    if not sources:
        raise EtlError(
            f"no input files found at {src}; expected .jsonl, .json or .parquet files "
            "(optionally .gz or .zst), a directory holding them, or a glob"
        )
    return sorted(sources, key=lambda s: Path(s.name).parts)  # as Path sorting: by part


def _name(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base))
    except ValueError:  # a glob match outside its prefix (`..`): name it as matched
        return str(path)


RAW_BLOCK = 1 << 16  # compressed bytes fed to a decompressor at a time


class _DecompressedStream:
    """A decompressed byte stream over raw blocks, with damage reported after the good data.

    `read(n)` returns every byte decompressed before damage (a truncated stream, a corrupt
    block); the error is raised by the next call. So complete records before the damage are
    yielded however the caller sizes its reads, and then the file is `UnreadableFile`.
    """

    def __init__(self, fh: BinaryIO, compression: str) -> None:
        self._fh = fh
        self._compression = compression
        self._pending = bytearray()
        self._error: Exception | None = None
        self._done = False
        self._dec = self._new_decompressor()
        self._member_started = False  # gzip: a member has begun (trailing zero padding is not one)
        self.closed = False

    def _new_decompressor(self) -> Any:  # a zlib or zstandard decompression object
        if self._compression == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj()

    def _feed(self, data: bytes) -> None:
        """Decompress `data` into the pending buffer (gzip: member after member)."""
        if self._compression == "gzip":
            while data:
                if not self._member_started:
                    stripped = data.lstrip(b"\x00")  # padding after the last member
                    if not stripped:
                        return
                    data, self._member_started = stripped, True
                self._pending += self._dec.decompress(data)
                if not self._dec.eof:
                    return
                data = self._dec.unused_data
                self._dec, self._member_started = self._new_decompressor(), False
        else:
            while data:
                self._member_started = True
                self._pending += self._dec.decompress(data)
                if not self._dec.eof:
                    return
                data = self._dec.unused_data
                self._dec, self._member_started = self._new_decompressor(), False  # a next frame

    def _fill(self, n: int) -> None:
        import zstandard

        while len(self._pending) < n and not self._done and self._error is None:
            raw = self._fh.read(RAW_BLOCK)
            try:
                if not raw:
                    self._done = True
                    if self._compression == "gzip":
                        self._pending += self._dec.flush()
                        truncated = self._member_started
                    else:
                        truncated = self._member_started and not self._dec.eof
                    if truncated:
                        self._error = EOFError(f"truncated {self._compression} stream")
                    return
                self._feed(raw)
            except (zlib.error, zstandard.ZstdError) as exc:
                self._error = UnreadableFile(f"corrupt {self._compression} stream ({exc})")

    def read(self, n: int = -1) -> bytes:
        self._fill(n if n >= 0 else 1 << 62)
        if not self._pending and self._error is not None:
            error, self._error = self._error, None
            self._done = True
            raise error
        if n < 0 or n >= len(self._pending):
            out = bytes(self._pending)
            self._pending.clear()
        else:
            out = bytes(self._pending[:n])
            del self._pending[:n]
        return out

    def close(self) -> None:
        self.closed = True
        self._fh.close()

    def __enter__(self) -> BinaryIO:
        return self  # type: ignore[return-value]

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open_binary(source: Source, raw: list[BinaryIO] | None = None) -> BinaryIO:
    """The decompressed byte stream; `raw` receives the file object under it (for tell())."""
    fh = open(source.path, "rb")  # noqa: SIM115 (closed by the stream that wraps it)
    if raw is not None:
        raw.append(fh)
    if source.compression in ("gzip", "zstd"):
        return _DecompressedStream(fh, source.compression)  # type: ignore[return-value]
    return fh


def _lines_from_block(block: bytes, first_line: int) -> pa.Table:
    """Split a block of whole lines into a (source_line, line) table without copying text.

    Each string keeps its own trailing newline (JSON ignores trailing whitespace), so the
    strings are contiguous in the block and Arrow can point at it directly. Blank lines are
    not records: they are dropped, and the others keep their physical 0-based line numbers.
    """
    buf = np.frombuffer(block, dtype=np.uint8)
    ends = np.flatnonzero(buf == 10) + 1
    if len(buf) and buf[-1] != 10:
        ends = np.append(ends, len(buf))
    offsets = np.concatenate(([0], ends)).astype(np.int64)
    lines = pa.LargeStringArray.from_buffers(len(ends), pa.py_buffer(offsets.tobytes()), pa.py_buffer(block))
    line_no = pa.array(np.arange(first_line, first_line + len(ends), dtype=np.int64))
    table = pa.table([line_no, lines], schema=RAW_SCHEMA)
    lengths = np.diff(offsets)
    if (lengths <= 2).any():  # only then can a line be blank; skip the check otherwise
        nonblank = pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(lines)), 0)
        table = table.filter(nonblank)
    return table


def _valid_utf8(block: bytes) -> bytes:
    """The block, with each line that is not valid UTF-8 replaced by a marker line.

    The strict decode is one C pass (~GB/s); the per-line repair runs only for broken blocks.
    """
    try:
        block.decode("utf-8")
        return block
    except UnicodeDecodeError:
        pass
    fixed = []
    for line in block.split(b"\n"):
        try:
            line.decode("utf-8")
            fixed.append(line)
        except UnicodeDecodeError:
            fixed.append((INVALID_UTF8 + repr(line[:200])).encode("utf-8"))
    return b"\n".join(fixed)


def _jsonl_chunks(source: Source, chunk_bytes: int, progress: Progress | None = None) -> Iterator[pa.Table]:
    next_line = 0
    rest = b""
    raw: list[BinaryIO] = []
    with _open_binary(source, raw) as fh:
        first = True
        while True:
            data = fh.read(chunk_bytes)
            if first and data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark is not data
                data, first = data[3:], False
            first = False
            if progress is not None and not raw[0].closed:
                progress(raw[0].tell())
            block = rest + data
            if not data:
                if block:
                    block = _valid_utf8(block)
                    yield _lines_from_block(block, next_line)
                return
            cut = block.rfind(b"\n") + 1
            if cut == 0:  # one line longer than the block: keep reading
                rest = block
                continue
            block, rest = block[:cut], block[cut:]
            block = _valid_utf8(block)
            table = _lines_from_block(block, next_line)
            next_line += block.count(b"\n")
            yield table


def _yield_by_bytes(batches: Iterator[pa.Array], chunk_bytes: int) -> Iterator[pa.Table]:
    """(source_line, line) tables from batches of lines, each cut once its text reaches
    `chunk_bytes` (so a chunk overshoots by at most one record, however large the batches).

    Numbering is continuous, so the output is the same however the input is batched.
    """
    pending: list[pa.Array] = []
    size = first = 0

    def flush() -> pa.Table:
        lines = pa.concat_arrays(pending) if len(pending) > 1 else pending[0]
        line_no = pa.array(np.arange(first, first + len(lines), dtype=np.int64))
        return pa.table([line_no, lines], schema=RAW_SCHEMA)

    for batch in batches:
        lines = batch.cast(pa.large_string())
        while len(lines):
            offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)
            offsets = offsets[lines.offset : lines.offset + len(lines) + 1]
            ends = offsets[1:] - offsets[0]  # text bytes through each record
            take = int(np.searchsorted(ends, chunk_bytes - size, side="left")) + 1
            if take > len(lines):
                pending.append(lines)
                size += int(ends[-1])
                break
            pending.append(lines.slice(0, take))
            table = flush()
            yield table
            first += table.num_rows
            pending, size = [], 0
            lines = lines.slice(take)
    if pending:
        yield flush()


JSON_BATCH_RECORDS = 1024  # records fetched from DuckDB at a time (chunks are sized in bytes)


def _json_objects(source: Source, fmt: str, chunk_bytes: int) -> Iterator[pa.Table]:
    """Each top-level JSON value of the file as raw text (DuckDB `read_json_objects`).

    Raw text, not DuckDB's inferred struct, so a value's own types reach the validator.
    One DuckDB thread: with several, how many records of a damaged file come out before the
    error depends on a race.
    """
    import duckdb

    con = duckdb.connect(config={"threads": 1})
    try:
        reader = con.sql(
            "select json::varchar as line from read_json_objects($path, format = $format, "
            "maximum_object_size = 1073741824)",
            params={"path": str(source.path), "format": fmt},
        ).to_arrow_reader(JSON_BATCH_RECORDS)
        yield from _yield_by_bytes((batch.column(0) for batch in reader), chunk_bytes)
    except duckdb.Error as exc:
        raise UnreadableFile(f"not readable as JSON ({str(exc).splitlines()[0]})") from exc
    finally:
        con.close()


def _first_line(source: Source) -> bytes:
    """The file's decompressed start: through its first non-blank line (BOM removed).

    Stops early once the first non-blank character is `[` (an array needs no more).
    """
    head = b""
    with _open_binary(source) as fh:
        while True:
            data = fh.read(1 << 16)
            head += data
            if head.startswith(b"\xef\xbb\xbf"):
                head = head[3:]
            body = head.lstrip()
            if not data or body.startswith(b"[") or b"\n" in body:
                return body.split(b"\n", 1)[0]


def _json_chunks(source: Source, chunk_bytes: int) -> Iterator[pa.Table]:
    """A .json file: an array of records, one object (possibly pretty-printed), or JSON lines."""
    first_line = _first_line(source)
    if first_line.startswith(b"["):
        yield from _json_objects(source, "array", chunk_bytes)
        return
    try:
        import json

        json.loads(first_line)
        one_record_per_line = True
    except ValueError:
        one_record_per_line = False
    if one_record_per_line:  # JSON lines named .json: per-line rejects keep working
        yield from _jsonl_chunks(source, chunk_bytes)
    else:  # one or more pretty-printed objects
        yield from _json_objects(source, "unstructured", chunk_bytes)


PARQUET_BATCH_ROWS = 1024  # at most this many rows converted at a time


def _parquet_chunks(source: Source, chunk_bytes: int) -> Iterator[pa.Table]:
    import duckdb
    import pyarrow.parquet as pq

    con = duckdb.connect(config={"threads": 1})
    try:
        pf = pq.ParquetFile(source.path)
        meta = pf.metadata
        groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
        row_bytes = max((g.total_byte_size / max(1, g.num_rows) for g in groups), default=1.0)
        batch_rows = int(max(1, min(PARQUET_BATCH_ROWS, chunk_bytes // max(1.0, row_bytes))))

        def json_lines() -> Iterator[pa.Array]:
            for batch in pf.iter_batches(batch_size=batch_rows):
                # Rows become JSON text so that one parser validates every input kind alike.
                rows = con.sql("select to_json(b)::varchar as line from batch b").to_arrow_table()
                yield rows.column(0).combine_chunks()

        yield from _yield_by_bytes(json_lines(), chunk_bytes)
    except (OSError, pa.ArrowInvalid) as exc:
        raise UnreadableFile(f"not a readable Parquet file ({exc})") from exc
    finally:
        con.close()


def read_chunks(
    source: Source, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES, progress: Progress | None = None
) -> Iterator[pa.Table]:
    """Yield bounded `(source_line, line)` tables of one file, in file order.

    `progress`, when given, is called with the bytes of the (compressed) file read so far;
    JSON lines report after every block, other kinds once per file (by the caller).

    Raises:
        UnreadableFile: the file (or the rest of it) cannot be parsed at all.
    """
    if source.kind == "dir":
        raise UnreadableDir(f"cannot list folder ({source.error})")
    try:
        if source.kind == "jsonl":
            yield from _jsonl_chunks(source, chunk_bytes, progress)
        elif source.kind == "json":
            yield from _json_chunks(source, chunk_bytes)
        else:
            yield from _parquet_chunks(source, chunk_bytes)
    except (OSError, EOFError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise UnreadableFile(f"cannot read ({exc})") from exc
