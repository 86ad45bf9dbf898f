"""Message fields no option reads: one warning per run per field, naming the key that reads it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.config.run_config import RunConfig
from etl.errors import EtlError, EtlWarning
from etl.formats.builders import BUILDERS, run_builder
from etl.formats.unread_fields import SAMPLE_LINES
from etl.pipeline.run import run

ROLES = ("system", "user", "assistant", "tool")
USER = {"role": "user", "content": "hi"}
BOT = {"role": "assistant", "content": "yo"}


def raw_table(records: list[Any], first_line: int = 0) -> pa.Table:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    return pa.table({"source_line": pa.array(range(first_line, first_line + len(lines)), pa.int64()),
                     "line": pa.array(lines, pa.large_string())})


def warned(builder: str, *chunks: list[Any], first_lines: tuple[int, ...] = (), **options: Any) -> list[str]:
    """The EtlWarnings of one query run over chunks of records (each numbered from its first line)."""
    query = BUILDERS[builder](roles=ROLES, **options)
    con = duckdb.connect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, records in enumerate(chunks):
            run_builder(con, raw_table(records, first_lines[i] if first_lines else 0), query)
    return [str(w.message) for w in caught if issubclass(w.category, EtlWarning)]


def test_golden_text_names_the_field_count_and_fix() -> None:
    recs = [{"messages": [{**USER, "name": "bob"}, BOT]}, {"messages": [USER, BOT]},
            {"messages": [{**USER, "name": "al"}]}]
    assert warned("chat", recs) == [
        ('message field "name" is not read (in 2 of 3 records sampled at the start of an input file): etl has no '
         "reader for it; list it in input.ignore_fields to silence this warning")]


@pytest.mark.parametrize(("builder", "options", "field", "fix"), [
    ("chat", {"reasoning_keys": []}, "reasoning_content",
     'add "reasoning_content" to input.reasoning_keys to read it, or'),
    ("chat", {"tool_calls_key": None}, "tool_calls", 'set input.tool_calls_key to "tool_calls" to read it, or'),
    ("chat", {}, "loss_weight", 'set input.weight_key to "loss_weight" to read it, or'),
    ("chat", {"train_key": None}, "train", 'set input.train_key to "train" to read it, or'),
    ("sharegpt", {}, "tool_calls", "etl has no reader for it;"),  # sharegpt has no tool_calls_key
])
def test_the_fix_names_the_config_key(builder: str, options: dict[str, Any], field: str, fix: str) -> None:
    value: Any = [{"name": "f", "arguments": "{}"}] if field == "tool_calls" else True
    message = {"from": "gpt", "value": "yo"} if builder == "sharegpt" else BOT
    key = "conversations" if builder == "sharegpt" else "messages"
    assert warned(builder, [{key: [{**message, field: value}]}], **options) == [
        (f'message field "{field}" is not read (in 1 of 1 records sampled at the start of an input file): '
         f"{fix} list it in input.ignore_fields to silence this warning")]


@pytest.mark.parametrize(("message", "options"), [
    ({**BOT, "reasoning_content": "r"}, {}),  # read by the default reasoning_keys
    ({**BOT, "loss_weight": 0.5}, {"weight_key": "loss_weight"}),
    ({**BOT, "tool_calls": [{"name": "f", "arguments": "{}"}]}, {}),
    ({**BOT, "name": "bob", "audio": {"id": "a"}}, {"ignore_fields": ["name", "audio"]}),
    ({**BOT, "id": "m1"}, {}),  # built-in: metadata no template renders
    # nothing to lose: null and empty values (OpenAI exports, Parquet structs' absent fields)
    ({**BOT, "refusal": None, "name": "", "tool_calls": [], "function_call": {}}, {"tool_calls_key": None}),
])
def test_fields_read_ignored_or_empty_do_not_warn(message: dict[str, Any], options: dict[str, Any]) -> None:
    assert warned("chat", [{"messages": [USER, message]}], **options) == []


def test_one_warning_per_field_across_chunks_and_past_the_sample() -> None:
    rec = {"messages": [{**USER, "name": "bob"}, {**BOT, "audio": {"data": "x"}}]}
    msgs = warned("chat", [rec], [rec, rec], [{"messages": [{**USER, "function_call": {"name": "f"}}]}],
                  [{"messages": [{**USER, "refusal": "no"}]}], first_lines=(0, 1, 0, SAMPLE_LINES))
    # one each, by first record then name; `refusal` lies past the sampled lines of its file
    assert [m.split('"')[1] for m in msgs] == ["audio", "name", "function_call"]


def test_bad_records_do_not_stop_the_check() -> None:
    recs = ["not json", [1], {"messages": "text"}, {"messages": [3, {**BOT, "name": "x"}]}]
    assert [m.split('"')[1] for m in warned("chat", recs)] == ["name"]


def test_ignore_fields_must_be_a_list_of_names() -> None:
    with pytest.raises(EtlError, match="input.ignore_fields"):
        BUILDERS["chat"](roles=ROLES, ignore_fields="name")


def run_warnings(src: Path, out: Path, **input_options: Any) -> list[str]:
    config = RunConfig(template="chatml", tokenizer="bytes", chunk_bytes=200, input_options=input_options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(str(src), str(out), config, progress=False)
    return [str(w.message) for w in caught if issubclass(w.category, EtlWarning)]


def test_a_run_warns_once_per_field_across_files_and_chunks(tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    rec = {"messages": [{**USER, "name": "bob"}, BOT]}
    for name in ("a.jsonl", "b.jsonl"):  # ~80 bytes a record, 200-byte chunks: several per file
        (src / name).write_text("\n".join(json.dumps(rec) for _ in range(10)) + "\n")
    msgs = run_warnings(src, tmp_path / "out")
    unread = [m for m in msgs if "message field" in m]
    assert len(unread) == 1 and unread[0].startswith('message field "name" is not read (in ')
    assert not [m for m in run_warnings(src, tmp_path / "out", ignore_fields=["name"]) if "message field" in m]


def test_parquet_structs_warn_only_for_fields_that_hold_values(tmp_path: Path) -> None:
    # Parquet gives every message every struct field: `refusal` is null wherever it is absent.
    messages = [[{"role": "user", "content": "hi", "name": "bob", "refusal": None},
                 {"role": "assistant", "content": "yo", "name": None, "refusal": None}]]
    pq.write_table(pa.table({"messages": messages}), tmp_path / "a.parquet")
    msgs = run_warnings(tmp_path / "a.parquet", tmp_path / "out")
    assert [m.split('"')[1] for m in msgs if "message field" in m] == ["name"]
