"""A builder's query prepared once per DuckDB connection, then run over each raw chunk.

Binding and planning a conversation query (hundreds of lines of SQL, dozens of lambdas) cost the
same CPU every time it ran, whatever the rows: with the relation API's extra bind, half of a
1,956-record chunk's parse. A prepared statement is planned once; each chunk then only runs it
(the times: docs/design.md, Measured costs).

A prepared statement holds the object its plan scans, not the name it was looked up by:
re-registering `raw` for the next chunk would still read the first chunk. So the plan scans a
`ChunkStream` registered once under its own name, an object whose Arrow stream is the chunk
being parsed. Parameters become SQL literals: a parameter left open would make DuckDB bind the
statement again at every run (`json_transform` needs its structure at bind time).
"""

from __future__ import annotations

import itertools
import re
import threading
import weakref
from typing import Any

import duckdb
import pyarrow as pa

from etl.arrow_values import empty_table
from etl.columns import SOURCE_LINE

# The raw chunk's columns, as every statement prepared here is planned for them.
RAW_COLUMNS = pa.schema([(SOURCE_LINE, pa.int64()), ("line", pa.large_string())])
PARAMETER = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
# Characters a literal spells as chr(n): controls (a NUL would end the SQL text) and DEL.
UNPRINTABLE = re.compile(r"([\x00-\x1f\x7f])")
_names = itertools.count()
_lock = threading.Lock()


class ChunkStream:
    """The Arrow stream of whichever chunk is being parsed: what a prepared plan scans."""

    def __init__(self) -> None:
        self.table = empty_table(RAW_COLUMNS)

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.table.__arrow_c_stream__(requested_schema)


class Statements:
    """One connection's prepared statements (by SQL text) and the stream their plans read.

    It keeps no reference to its connection: it is the value of a weak-keyed map.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.stream = ChunkStream()
        self.source = f"etl_parse_input_{next(_names)}"
        self.names: dict[str, str] = {}
        con.register(self.source, self.stream)
        # DuckDB's allocator keeps what a query freed unless its background thread purges it: a
        # 16 MiB chunk's parse left ~0.1 GB resident under the next chunk's tokenizing.
        # Process-wide and idempotent.
        con.execute("set allocator_background_threads = true")

    def name(self, con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> str:
        """The prepared statement of `sql` with `params` bound, prepared on first use."""
        key = sql + "\x00" + repr(sorted(params.items()))
        if key not in self.names:
            name = f"etl_parse_{next(_names)}"
            body = PARAMETER.sub(lambda m: literal(params[m[1]]) if m[1] in params else m[0], sql)
            source = f"select {SOURCE_LINE}, line from {self.source}"
            con.execute(f"prepare {name} as with raw as ({source}) select * from ({body})")
            self.names[key] = name
        return self.names[key]

    def run(self, con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any], raw: pa.Table) -> pa.Table:
        """`sql` over `raw` (as the relation `raw`): the prepared statement run on this chunk."""
        name = self.name(con, sql, params)
        self.stream.table = _raw_columns(raw)
        try:
            return con.sql(f"execute {name}").to_arrow_table()
        finally:
            self.stream.table = empty_table(RAW_COLUMNS)  # the chunk's memory is not kept


_STATEMENTS: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, Statements] = weakref.WeakKeyDictionary()


def statements(con: duckdb.DuckDBPyConnection) -> Statements:
    """`con`'s prepared statements, made on first use; they live as long as the connection."""
    with _lock:
        found = _STATEMENTS.get(con)
        if found is None:
            found = _STATEMENTS[con] = Statements(con)
        return found


def run_prepared(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any], raw: pa.Table) -> pa.Table:
    """Run a query over the relation `raw` (a raw chunk) with its plan made once per connection.

    The trade-off: each distinct query keeps its plan on the connection for the connection's
    life (a few per run), and the parameters are spelled into the SQL as literals.
    """
    return statements(con).run(con, sql, params, raw)


def _raw_columns(raw: pa.Table) -> pa.Table:
    """`raw`'s two columns with exactly the types the plan was made for (a view when they have them)."""
    table = raw.select([SOURCE_LINE, "line"])
    return table if table.schema.equals(RAW_COLUMNS) else table.cast(RAW_COLUMNS)


def literal(value: Any) -> str:
    """A parameter value as SQL: strings, integers, booleans and lists of strings.

    A string is quoted with its single quotes doubled (DuckDB's strings have no backslash
    escapes), its control characters as chr(n).
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        # split keeps each unprintable character as its own piece (odd positions)
        pieces = UNPRINTABLE.split(value)
        parts = [f"chr({ord(p)})" if i % 2 else "'" + p.replace("'", "''") + "'" for i, p in enumerate(pieces)]
        return "(" + " || ".join(parts) + ")"
    if isinstance(value, list):
        return "([" + ", ".join(literal(v) for v in value) + "]::varchar[])"
    raise TypeError(f"no SQL literal for a {type(value).__name__} parameter: {value!r}")
