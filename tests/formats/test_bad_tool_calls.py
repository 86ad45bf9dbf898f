"""Tool calls a template cannot render (no name) reject their record as `bad_tool_call`.

Before, such a call was rendered `{"name": "", "arguments": <the whole call>}` and trained.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from etl.cli import main
from etl.output.manifest import read_manifest
from tests.formats.test_builders import build

NAMED = {"name": "f", "arguments": {"x": 1}}
ASK = {"role": "user", "content": "hi"}


def chat(*calls: Any, content: str = "") -> dict[str, Any]:
    return {"messages": [ASK, {"role": "assistant", "content": content, "tool_calls": list(calls)}]}


@pytest.mark.parametrize(("call", "shown"), [
    ({"arguments": {"x": 1}}, '{"arguments":{"x":1}}'),  # no name
    ({"type": "function", "function": {"arguments": "{}"}},  # OpenAI-style, no name inside
     '{"type":"function","function":{"arguments":"{}"}}'),
    ({"name": "", "arguments": {}}, '{"name":"","arguments":{}}'),  # an empty name renders as none
    ({"name": " ", "arguments": {}}, '{"name":" ","arguments":{}}'),
    ({"name": 3, "arguments": {}}, '{"name":3,"arguments":{}}'),  # not a string
    (None, "null"),
    ("f(1)", '"f(1)"'),  # not an object
])
@pytest.mark.parametrize("template_tools", [True, False])
def test_a_call_without_a_name_rejects_its_record(call: Any, shown: str, template_tools: bool) -> None:
    row = build("chat", chat(NAMED, call), template_tools=template_tools)[0]
    assert (row["reason"], row["detail"]) == ("bad_tool_call", 'message 1 has a tool call without a "name": ' + shown)
    assert row["messages"] is None and row["raw"] is not None


def test_named_calls_and_their_openai_form_stay() -> None:
    wrapped = {"type": "function", "function": {"name": "g", "arguments": "{}"}}
    row = build("chat", chat(NAMED, wrapped), template_tools=True)[0]
    assert row["reason"] is None and len(row["messages"][1]["calls"]) == 2


def test_sharegpt_function_call_turn_without_a_name_is_rejected() -> None:
    """glaive's `function_call` turn holds the call as text: a template with a tool format renders it."""
    record = {"conversations": [{"from": "human", "value": "hi"},
                                {"from": "function_call", "value": '{"arguments": {"x": 1}}'},
                                {"from": "observation", "value": "2"}]}
    good = {"conversations": [*record["conversations"][:1], {"from": "function_call", "value": json.dumps(NAMED)}]}
    rows = build("sharegpt", record, good, template_tools=True)
    assert [r["reason"] for r in rows] == ["bad_tool_call", None]
    assert rows[0]["detail"] == 'message 1 has a tool call without a "name": {"arguments": {"x": 1}}'
    # Without a tool format the turn is plain assistant text, as any other.
    assert build("sharegpt", record, template_tools=False)[0]["reason"] is None


def test_etl_run_rejects_it_and_trains_nothing_of_it(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in [chat({"arguments": {"a": 1}}), chat(NAMED)]), "utf-8")
    assert main(["run", str(src), str(tmp_path / "out"), "--template", "chatml", "--tokenizer", "bytes",
                 "--quiet"]) == 0
    counts = read_manifest(tmp_path / "out")["counts"]
    assert (counts["written"], counts["rejected"]) == (1, {"bad_tool_call": 1})
    rejects = pq.read_table(tmp_path / "out" / "_rejects").to_pylist()
    assert [(r["source_line"], r["reason"]) for r in rejects] == [(0, "bad_tool_call")]
    assert rejects[0]["detail"].startswith('message 1 has a tool call without a "name"')
