"""The per-chunk columns of `etl.ingest.preprocess`: split names, domains with their default, dedup
keys and split draws as numpy arrays; and none of them imports pandas (~0.85 s of a run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from etl.columns import DEFAULT_DOMAIN
from etl.formats.builders import BUILDERS, run_builder
from etl.ingest.preprocess import KEYS_SQL, domains, record_keys, splits


def good_rows(*texts: str) -> pa.Table:
    lines = [json.dumps({"messages": [{"role": "user", "content": t}]}) for t in texts]
    raw = pa.table({"source_line": pa.array(range(len(lines)), pa.int64()), "line": pa.array(lines, pa.large_string())})
    return run_builder(duckdb.connect(), raw, BUILDERS["chat"](roles=("user", "assistant")))


def test_splits_names_val_below_the_fraction() -> None:
    out = splits(np.array([0.0, 0.1, 0.5, 0.99, np.nan]), 0.5)
    assert out.type == pa.string()
    assert out.to_pylist() == ["val", "val", "train", "train", "train"]
    assert splits(np.zeros(0), 0.5).to_pylist() == []


def test_domains_fill_nulls_with_the_default() -> None:
    table = pa.table({"domain": pa.array(["a", None, "日本"], pa.string())})
    assert domains(table).to_pylist() == ["a", DEFAULT_DOMAIN, "日本"]
    assert domains(table, "it's é").to_pylist() == ["a", "it's é", "日本"]
    assert domains(pa.table({"x": [1, 2]}), "d").to_pylist() == ["d", "d"]
    assert domains(pa.table({"x": [1, 2]})).type == pa.string()


def test_record_keys_are_numpy_arrays_of_the_query_values() -> None:
    good = pa.concat_tables([good_rows("same", "other"), good_rows("same")])  # two Arrow chunks
    con = duckdb.connect()
    keys, draws = record_keys(con, good, source="s", exact=True, split_seed=1)
    assert keys.dtype == np.uint64 and draws.dtype == np.float64 and len(keys) == len(draws) == 3
    assert keys[0] == keys[2] != keys[1]  # the same text, the same key
    assert ((draws >= 0) & (draws < 1)).all()
    # the same numbers as DuckDB's rows read as Python values
    con.register("good", good.select(["source_line", "messages"]))
    rows = con.sql(KEYS_SQL, params={"source": "s", "prefix": 0, "seed": "1"}).fetchall()
    assert (keys.tolist(), draws.tolist()) == ([r[1] for r in rows], [r[2] for r in rows])


NO_PANDAS = """
import sys
import duckdb
import numpy as np
from etl.formats.builders import build_query, run_builder
from etl.ingest.discover import discover
from etl.ingest.preprocess import domains, record_keys, splits
from etl.ingest.reader import read_chunks
query = build_query("chat", roles=["user"], options={}, max_record_bytes=1 << 20)
con = duckdb.connect()
for source in discover(sys.argv[1]):
    for raw in read_chunks(source):
        parsed = run_builder(con, raw, query)
        good = parsed.filter(parsed.column("reason").is_null())
        keys, draws = record_keys(con, good, source="s", exact=False, split_seed=0)
        assert len(splits(draws, 0.5)) == len(domains(good)) == len(keys) == 2
print("pandas" in sys.modules)
"""


def test_a_chunk_through_parse_and_preprocess_imports_no_pandas(tmp_path: Path) -> None:
    pytest.importorskip("pandas")  # without pandas installed there is nothing to import
    path = tmp_path / "chats.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "a"}]}\n{"messages": []}\n'
                    '{"messages": [{"role": "user", "content": "b"}]}\n', encoding="utf-8")
    done = subprocess.run([sys.executable, "-c", NO_PANDAS, str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
