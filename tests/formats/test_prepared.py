"""A builder's query prepared once per connection (`etl.formats.prepared`): every chunk a
connection parses reads its own rows, options reach the SQL intact, and a parse imports no pandas."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from etl.formats.builders import BUILDERS, connect, run_builder
from etl.formats.prepared import literal, statements

ROLES = ("system", "user", "assistant", "tool")


def chunk(*records: object, first: int = 0, string_type: pa.DataType | None = None) -> pa.Table:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    return pa.table({"source_line": pa.array(range(first, first + len(lines)), pa.int64()),
                     "line": pa.array(lines, string_type or pa.large_string())})


def chat(*turns: tuple[str, str]) -> dict[str, object]:
    return {"messages": [{"role": r, "content": c} for r, c in turns]}


def contents(table: pa.Table) -> list[object]:
    """Each row's message contents, or its reason when rejected."""
    return [[m["content"] for m in row["messages"]] if row["reason"] is None else row["reason"]
            for row in table.to_pylist()]


def test_each_chunk_on_one_connection_reads_its_own_rows() -> None:
    con, query = connect(), BUILDERS["chat"](roles=ROLES)
    first = run_builder(con, chunk(chat(("user", "a"), ("assistant", "b"))), query)
    second = run_builder(con, chunk(chat(("user", "c")), "{not json", first=7), query)
    third = run_builder(con, chunk(first=9), query)
    assert contents(first) == [["a", "b"]]
    assert contents(second) == [["c"], "invalid_json"]
    assert second.column("source_line").to_pylist() == [7, 8]
    assert third.num_rows == 0 and third.schema == first.schema
    assert len(statements(con).names) == 1  # planned once, run three times


def test_two_queries_alternate_on_one_connection() -> None:
    con = connect()
    plain, mapped = BUILDERS["chat"](roles=ROLES), BUILDERS["chat"](roles=ROLES, role_map={"human": "user"})
    record = chunk(chat(("human", "hi")))
    for _ in range(2):
        assert run_builder(con, record, plain).column("reason").to_pylist() == ["unknown_role"]
        assert contents(run_builder(con, record, mapped)) == [["hi"]]
    assert len(statements(con).names) == 2


def test_options_with_quotes_and_control_characters_reach_the_sql_intact() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    record = chunk({"messages": [{"role": "user", "content": parts}], "sys": "s"})
    query = BUILDERS["chat"](roles=ROLES, part_separator="'\n\x00\"", system_key="sys",
                             tools_prefix="it's")
    assert contents(run_builder(connect(), record, query)) == [["s", "a'\n\x00\"b"]]
    for value in ("", "it's", "a\x00b\n\r\t\x7f", "日本 \u2028", "$roles"):
        assert duckdb.connect().execute(f"select {literal(value)}").fetchall() == [(value,)]
    assert duckdb.connect().execute(f"select {literal(['x', ''])}, {literal([])}").fetchall() == [(["x", ""], [])]
    with pytest.raises(TypeError, match="no SQL literal"):
        literal(1.5)


def test_a_string_typed_line_column_is_read_as_the_plan_expects() -> None:
    con, query = connect(), BUILDERS["chat"](roles=ROLES)
    assert contents(run_builder(con, chunk(chat(("user", "x"))), query)) == [["x"]]
    assert contents(run_builder(con, chunk(chat(("user", "y")), string_type=pa.string()), query)) == [["y"]]


def test_cursors_of_one_database_parse_in_parallel_threads() -> None:
    base, query = connect(), BUILDERS["chat"](roles=ROLES)
    results: dict[int, list[object]] = {}

    def parse(worker: int) -> None:
        cursor = base.cursor()
        for i in range(5):
            text = f"w{worker}-{i}"
            results.setdefault(worker, []).extend(contents(run_builder(cursor, chunk(chat(("user", text))), query)))

    threads = [threading.Thread(target=parse, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {w: [[f"w{w}-{i}"] for i in range(5)] for w in range(2)}


# Run in a fresh interpreter: another test's imports would hide one made by the parse.
NO_PANDAS = """
import json, sys, warnings
from etl.formats.builders import build_query, connect, run_builder
from etl.ingest.discover import discover
from etl.ingest.reader import read_chunks
assert "pandas" not in sys.modules, "imported before the parse"
query = build_query("chat", roles=["user", "assistant"], options={}, max_record_bytes=1 << 20)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = [run_builder(connect().cursor(), raw, query) for s in discover(sys.argv[1]) for raw in read_chunks(s)]
assert [t.column("reason").null_count for t in out] == [4] and any('"name"' in str(w.message) for w in caught)
print("pandas" in sys.modules)
"""


def test_parsing_a_chat_chunk_imports_no_pandas(tmp_path: Path) -> None:
    """pandas costs ~0.85 s to import: a run's first parse (unread-field check included) must not
    pull it in through pyarrow's conversions."""
    pytest.importorskip("pandas")  # without pandas installed there is nothing to import
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    records = [{"messages": turns}] * 3 + [{"messages": [{"role": "user", "content": "x", "name": "n"}]}]
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    done = subprocess.run([sys.executable, "-c", NO_PANDAS, str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
