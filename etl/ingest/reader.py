"""Stream input files (found by `etl.ingest.discover`) as bounded chunks of raw JSON records.

Every chunk is an Arrow table `(source_line int64, line large_string)`: one JSON text per
record, whatever the file type, so one vectorized parser (`etl.formats.builders`) validates them all.
JSONL is split on newlines with numpy over a byte block (zero-copy strings; `etl.ingest.lines`); JSON arrays and
Parquet go through DuckDB / pyarrow batch readers. Memory is bounded by `chunk_bytes`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from etl.config.run_config import DEFAULT_CHUNK_BYTES
from etl.ingest.decompress import open_binary, verify
from etl.ingest.discover import NOT_READ, Source, UnreadableFile
from etl.ingest.lines import RAW_SCHEMA, Progress, jsonl_chunks, line_numbers
from etl.ingest.objects import local_copy, parquet_file

# `etl run`'s first chunk of a run: all of its reading and splitting comes before the first parse
# can start, so it is small; the next chunk is read while this one parses (docs/design.md, Start-up).
FIRST_CHUNK_BYTES = 1 << 20


def run_first_bytes(index: int, chunk_bytes: int) -> int | None:
    """`read_chunks`' `first_bytes` for a run's input file `index` (both engines: the same parts)."""
    return min(FIRST_CHUNK_BYTES, chunk_bytes) if index == 0 else None


def _yield_by_bytes(batches: Iterator[pa.Array], chunk_bytes: int, first_bytes: int | None = None) -> Iterator[pa.Table]:
    """(source_line, line) tables from batches of lines, each cut once its text reaches
    `chunk_bytes` (`first_bytes` for the first; so a chunk overshoots by at most one record,
    however large the batches).

    Numbering is continuous, so the output is the same however the input is batched.
    """
    pending: list[pa.Array] = []
    size = first = 0
    limit = first_bytes or chunk_bytes

    def flush() -> pa.Table:
        lines = pa.concat_arrays(pending) if len(pending) > 1 else pending[0]
        return pa.table([line_numbers(first, len(lines)), lines], schema=RAW_SCHEMA)

    for batch in batches:
        lines = batch.cast(pa.large_string())
        while len(lines):
            offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)
            offsets = offsets[lines.offset : lines.offset + len(lines) + 1]
            ends = offsets[1:] - offsets[0]  # text bytes through each record
            take = int(np.searchsorted(ends, limit - size, side="left")) + 1
            if take > len(lines):
                pending.append(lines)
                size += int(ends[-1])
                break
            pending.append(lines.slice(0, take))
            table = flush()
            yield table
            first += table.num_rows
            pending, size, limit = [], 0, chunk_bytes
            lines = lines.slice(take)
    if pending:
        yield flush()


JSON_BATCH_RECORDS = 1024  # records fetched from DuckDB at a time (chunks are sized in bytes)


def _json_objects(source: Source, fmt: str, chunk_bytes: int, first_bytes: int | None) -> Iterator[pa.Table]:
    """Each top-level JSON value of the file as raw text (DuckDB `read_json_objects`).

    Raw text, not DuckDB's inferred struct, so a value's own types reach the validator.
    One DuckDB thread: with several, how many records of a damaged file come out before the
    error depends on a race.
    """
    # duckdb (docs/design.md, Measured costs): only when a file is read through DuckDB
    import duckdb

    # duckdb (docs/design.md, Measured costs): only when a file is read through DuckDB
    from etl.formats.builders import connect

    con = connect(threads=1)
    try:
        with _local_file(source) as path:
            reader = con.sql(
                "select json::varchar as line from read_json_objects($path, format = $format, "
                "maximum_object_size = 1073741824)",
                params={"path": str(path), "format": fmt},
            ).to_arrow_reader(JSON_BATCH_RECORDS)
            yield from _yield_by_bytes((batch.column(0) for batch in reader), chunk_bytes, first_bytes)
    except duckdb.Error as exc:
        raise UnreadableFile(f"not readable as JSON ({str(exc).splitlines()[0]})") from exc
    finally:
        con.close()


def _local_file(source: Source) -> AbstractContextManager[Path]:
    """The file's local path: DuckDB reads local files only, so a file of a URI SRC (s3://,
    gs://...) is copied to a temporary file first (`etl.ingest.objects.local_copy`)."""
    if isinstance(source.path, Path):
        return nullcontext(source.path)

    return local_copy(source.path)


def _first_line(source: Source) -> bytes:
    """The file's decompressed start: through its first non-blank line (BOM removed).

    Stops early once the first non-blank character is `[` (an array needs no more).
    """
    head = b""
    with open_binary(source) as fh:
        while True:
            data = fh.read(1 << 16)
            head += data
            if head.startswith(b"\xef\xbb\xbf"):
                head = head[3:]
            body = head.lstrip()
            if not data or body.startswith(b"[") or b"\n" in body:
                return body.split(b"\n", 1)[0]


def _json_chunks(source: Source, chunk_bytes: int, first_bytes: int | None) -> Iterator[pa.Table]:
    """A .json file: an array of records, one object (possibly pretty-printed), or JSON lines."""
    first_line = _first_line(source)
    if first_line.startswith(b"["):
        yield from _json_objects(source, "array", chunk_bytes, first_bytes)
        return
    try:
        json.loads(first_line)
        one_record_per_line = True
    except ValueError:
        one_record_per_line = False
    if one_record_per_line:  # JSON lines named .json: per-line rejects keep working
        yield from jsonl_chunks(source, chunk_bytes, first_bytes=first_bytes)
    else:  # one or more pretty-printed objects
        yield from _json_objects(source, "unstructured", chunk_bytes, first_bytes)


PARQUET_BATCH_ROWS = 1024  # at most this many rows converted at a time


IMAGE_FIELDS = ("bytes", "path")  # Hugging Face datasets' `Image` feature: struct<bytes: binary, path: string>


def _is_image(t: pa.DataType) -> bool:
    return pa.types.is_struct(t) and sorted(f.name for f in t) == sorted(IMAGE_FIELDS) and (
        pa.types.is_binary(t.field("bytes").type) or pa.types.is_large_binary(t.field("bytes").type))


def _image_uris(images: pa.StructArray) -> pa.StructArray:
    """HF `Image` structs with their bytes as `data:image/*;base64,` text (what to_json keeps whole)."""
    data = [None if b is None else "data:image/*;base64," + base64.b64encode(b).decode()
            for b in images.field("bytes").to_pylist()]  # per image: its bytes are read for it anyway
    return pa.StructArray.from_arrays([pa.array(data, pa.string()), images.field("path")], names=list(IMAGE_FIELDS),
                                      mask=images.is_null())


def images_as_uris(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A Parquet batch whose image columns (an `Image`, or a list of them) carry their bytes as data
    URIs: DuckDB's to_json writes a blob as escaped text (`\\x89PNG...`), which no reader decodes."""
    columns = list(batch.columns)
    for i, col in enumerate(columns):
        if _is_image(col.type):
            columns[i] = _image_uris(col)
        elif pa.types.is_list(col.type) and _is_image(col.type.value_type):
            columns[i] = pa.ListArray.from_arrays(col.offsets, _image_uris(col.values), mask=col.is_null())
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names) if columns != list(batch.columns) else batch


def _parquet_chunks(source: Source, chunk_bytes: int, first_bytes: int | None) -> Iterator[pa.Table]:
    # duckdb (docs/design.md, Measured costs): only when a file is read through DuckDB
    from etl.formats.builders import connect

    con = connect(threads=1)
    try:
        if isinstance(source.path, Path):
            pf = pq.ParquetFile(source.path)
        else:  # SRC given as a URI: read by ranges through pyarrow's filesystem
            pf = parquet_file(source.path)
        meta = pf.metadata
        groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
        row_bytes = max((g.total_byte_size / max(1, g.num_rows) for g in groups), default=1.0)
        batch_rows = int(max(1, min(PARQUET_BATCH_ROWS, chunk_bytes // max(1.0, row_bytes))))

        def json_lines() -> Iterator[pa.Array]:
            for batch in map(images_as_uris, pf.iter_batches(batch_size=batch_rows)):
                # Rows become JSON text so that one parser validates every input kind alike.
                rows = con.sql("select to_json(b)::varchar as line from batch b").to_arrow_table()
                yield rows.column(0).combine_chunks()

        yield from _yield_by_bytes(json_lines(), chunk_bytes, first_bytes)
    except (OSError, pa.ArrowInvalid) as exc:
        raise UnreadableFile(f"not a readable Parquet file ({exc})") from exc
    finally:
        con.close()


def read_chunks(
    source: Source, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES, progress: Progress | None = None,
    first_bytes: int | None = None,
) -> Iterator[pa.Table]:
    """Yield bounded `(source_line, line)` tables of one file, in file order.

    `progress`, when given, is called with the bytes of the (compressed) file read so far;
    JSON lines report after every block, other kinds once per file (by the caller).
    `first_bytes`, when given, sizes the first chunk instead of `chunk_bytes` (`etl run` starts
    small, so parsing starts sooner: `FIRST_CHUNK_BYTES`).

    Raises:
        UnreadableFile: the file (or the rest of it) cannot be parsed at all; `CorruptFile`: a
            compressed file failed its check (`verify`, before its first chunk): nothing yielded.
    """
    if source.kind == NOT_READ:
        raise source.not_read()
    try:
        if source.compression is not None:  # none of a damaged archive is used
            verify(source)
        if source.kind == "jsonl":
            yield from jsonl_chunks(source, chunk_bytes, progress, first_bytes=first_bytes)
        elif source.kind == "json":
            yield from _json_chunks(source, chunk_bytes, first_bytes)
        else:
            yield from _parquet_chunks(source, chunk_bytes, first_bytes)
    except (OSError, EOFError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise UnreadableFile(f"cannot read ({exc})") from exc
