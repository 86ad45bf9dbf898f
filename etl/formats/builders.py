"""The builders by input type name (`BUILDERS`), and running one over a raw chunk.

A builder turns the `(source_line, line)` table of `etl.ingest.reader` into canonical rows
`(source_line, reason, detail, raw, messages list<struct<role, content, train, weight>>,
domain)`; `reason` is null for good rows, names the first problem of a rejected row, and
starts with `drop:` for rows filtered on purpose (text length). DuckDB's JSON functions
type-check every record in one pass; Polars' `json_decode` fails a whole batch on the first
malformed line and silently casts numbers to strings, which would hide bad records.
Builders live in `etl.formats.*`; `BUILDERS` names them, under the names `etl.columns.INPUT_TYPES`
lists (kept there so `etl run --help` imports no DuckDB; a test keeps the two equal).
A record longer than the query's `max_record_bytes` is rejected (`record_too_large`) here,
before DuckDB parses it: memory then follows the chunk, not the largest record.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.formats import conversation, instruction, preference, text, transcript
from etl.formats.base import (
    DEFAULT_MAX_RECORD_BYTES,
    RAW_PREVIEW_CHARS,
    TOO_LARGE,
    Builder,
    BuilderQuery,
    json_key_path,
)
from etl.formats.prepared import run_prepared

__all__ = [
    "BUILDERS", "DEFAULT_MAX_RECORD_BYTES", "RAW_PREVIEW_CHARS", "TOO_LARGE", "Builder", "BuilderQuery",
    "build_query", "connect", "json_key_path", "record_bytes", "run_builder", "warn_unread",
]

# `input.type` -> its builder; a new input type is a builder here and its name in INPUT_TYPES.
BUILDERS: dict[str, Builder] = {
    "chat": conversation.chat_builder,
    "sharegpt": conversation.sharegpt_builder,
    "instruction": instruction.instruction_builder,
    "prompt_completion": instruction.prompt_completion_builder,
    "text": text.text_builder,
    "transcript": transcript.transcript_builder,
    "preference": preference.preference_builder,
    "unpaired": preference.unpaired_builder,
}


def build_query(input_type: str, *, roles: list[str], options: dict[str, Any], max_record_bytes: int,
                template_tools: bool = False) -> BuilderQuery:
    """The query of `input_type`'s builder with its options, and the record size limit that every
    input type shares (`preprocessing.max_record_bytes`, kept out of the builders' own options).

    `template_tools` (the template renders tools and tool calls) reaches builders that take it.
    """
    builder = BUILDERS[input_type]
    params = inspect.signature(builder).parameters
    takes = "template_tools" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
    run_args = {"template_tools": template_tools} if takes else {}
    return dataclasses.replace(builder(roles=roles, **options, **run_args), max_record_bytes=max_record_bytes)


# DuckDB keeps freed memory in its allocator up to this much before giving it back after a
# query (default 128 MiB). Parsing a 16 MiB chunk peaks at ~100 MiB; with the default, a run
# kept ~80 MiB more resident per parse connection for nothing (T0 slice x10: 371 -> 308 MiB
# after two chunks parsed).
ALLOCATOR_FLUSH = "16MB"


def connect(**config: Any) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection for parsing chunks: returns freed memory to the system after each query."""
    return duckdb.connect(config={"allocator_flush_threshold": ALLOCATOR_FLUSH, **config})


def run_builder(con: duckdb.DuckDBPyConnection, raw: pa.Table, query: BuilderQuery) -> pa.Table:
    """Run a builder over one raw chunk; returns the canonical table (good and bad rows).

    Records over `query.max_record_bytes` never reach DuckDB: they come back as
    `record_too_large` rows, in line order with the others. A query with an `unread` check
    warns here about message fields it does not read (once per field per query).
    """
    too_large = record_bytes(raw.column("line")) > query.max_record_bytes
    if not too_large.any():
        return _run_sql(con, raw, query)
    parsed = _run_sql(con, raw.filter(pa.array(~too_large)), query)
    rejected = _too_large_rows(raw.filter(pa.array(too_large)), parsed.schema, query.max_record_bytes)
    table = pa.concat_tables([parsed, rejected])
    return table.take(pc.sort_indices(table.column("source_line")))


def warn_unread(con: duckdb.DuckDBPyConnection, raw: pa.Table, query: BuilderQuery) -> None:
    """The warnings about unread message fields `run_builder` gives for `raw`, without the parse (a
    chunk the token cache holds parsed): the query's check over the registered chunk."""
    if query.unread is None:
        return
    con.register("raw", raw)
    try:
        query.unread.check(con, raw)
    finally:
        con.unregister("raw")


def _run_sql(con: duckdb.DuckDBPyConnection, raw: pa.Table, query: BuilderQuery) -> pa.Table:
    """The query over `raw`, planned once per connection (`etl.formats.prepared`): its planning
    saved on every chunk, whatever its size."""
    if query.compose is not None:
        return query.compose(con, raw, run_builder)
    if raw.num_rows:
        warn_unread(con, raw, query)
    return run_prepared(con, query.sql, query.params, raw)


# DuckDB scans a registered Arrow table one record batch per thread: cut into a batch per core,
# T0's chunks parsed in about half the time on 2 cores (docs/design.md, Measured costs), rows in
# the same order (DuckDB keeps insertion order). Smaller tables stay whole. The parse now scans a
# stream, one thread a chunk, in less CPU (`etl.formats.prepared`); the token cache's keys still
# use this.
SPLIT_ROWS = 2048


def in_batches(raw: pa.Table) -> pa.Table:
    """`raw` as one record batch per core (a view: no row is copied), when it is worth cutting."""
    parts = min(os.cpu_count() or 1, raw.num_rows // SPLIT_ROWS)
    if parts < 2:
        return raw
    return pa.Table.from_batches(raw.combine_chunks().to_batches(max_chunksize=-(-raw.num_rows // parts)))


def record_bytes(lines: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Bytes of each record's JSON text, not counting the line's own "\n" or "\r\n" (int64).

    Read from the Arrow offsets: no pass over the text.
    """
    chunks = lines.chunks if isinstance(lines, pa.ChunkedArray) else [lines]
    sizes = [np.zeros(0, np.int64)]
    for arr in chunks:
        arr = arr.cast(pa.large_string())
        offsets = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset : arr.offset + len(arr) + 1]
        data = np.frombuffer(arr.buffers()[2], np.uint8) if arr.buffers()[2] is not None else np.zeros(1, np.uint8)
        size = np.diff(offsets)
        ends = offsets[1:]
        newline = (size >= 1) & (data[np.maximum(ends - 1, 0)] == 0x0A)
        crlf = newline & (size >= 2) & (data[np.maximum(ends - 2, 0)] == 0x0D)
        sizes.append(size - newline - crlf)
    return np.concatenate(sizes)


def _too_large_rows(big: pa.Table, schema: pa.Schema, limit: int) -> pa.Table:
    """`record_too_large` rows in the builder's output schema: first 500 characters as `raw`.

    One Python line per rejected record builds its detail: such records are rare.
    """
    sizes = record_bytes(big.column("line"))
    detail = [
        f"the record is {size:,} bytes of JSON, over max_record_bytes {limit:,} ({limit / (1 << 20):.3g} MiB); "
        "raise preprocessing.max_record_bytes in a config or pass --max-record-mb to keep it"
        for size in sizes.tolist()
    ]
    n = big.num_rows
    given = {
        "source_line": big.column("source_line"),
        "reason": pa.array([TOO_LARGE] * n),
        "detail": pa.array(detail),
        "raw": pc.utf8_slice_codeunits(big.column("line"), 0, RAW_PREVIEW_CHARS),
    }
    return pa.table(
        [given[f.name].cast(f.type) if f.name in given else pa.nulls(n, f.type) for f in schema], schema=schema
    )
