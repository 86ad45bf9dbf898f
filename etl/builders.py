"""Record builders: vectorized DuckDB SQL that validates raw JSON records and normalizes them.

A builder turns the `(source_line, line)` table of `etl.reader` into canonical rows
`(source_line, reason, detail, raw, messages list<struct<role, content, train, weight>>,
domain)`; `reason` is null for good rows, names the first problem of a rejected row, and
starts with `drop:` for rows filtered on purpose (text length). DuckDB's JSON functions
type-check every record in one pass; Polars' `json_decode` fails a whole batch on the first
malformed line and silently casts numbers to strings, which would hide bad records.
Builders live in `etl.formats.*` and register by input type name with `@register_builder`.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa

# Importing the format modules registers their builders.
from etl.formats import conversation, instruction, text, transcript  # noqa: F401
from etl.formats.base import (
    BUILDERS,
    RAW_PREVIEW_CHARS,
    Builder,
    BuilderQuery,
    json_key_path,
    register_builder,
)

__all__ = [
    "BUILDERS", "RAW_PREVIEW_CHARS", "Builder", "BuilderQuery", "json_key_path", "register_builder",
    "run_builder",
]


def run_builder(con: duckdb.DuckDBPyConnection, raw: pa.Table, query: BuilderQuery) -> pa.Table:
    """Run a builder over one raw chunk; returns the canonical table (good and bad rows)."""
    con.register("raw", raw)
    try:
        return con.sql(query.sql, params=query.params).to_arrow_table()
    finally:
        con.unregister("raw")
