"""Every builder over every public sample file in ../shared/data: reject counts and exact output.

The expected counts follow ../shared/data/README.md (records per file, roles per file); the
expected messages are recomputed here in plain Python. Skipped when ../shared is absent.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from etl.formats.builders import BUILDERS, run_builder
from etl.ingest.discover import discover
from etl.ingest.reader import read_chunks

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
LF = SHARED / "llamafactory-demo"
T0 = SHARED / "t0-train-50k" / "t0_train_50k_per_template.jsonl.gz"
FASTCHAT = SHARED / "fastchat" / "dummy_conversation.json"
ROLES = ("system", "user", "assistant", "tool", "text")
EOT = "<|endoftext|>"

pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is absent")

# Records per file (README) and the one builder that reads each with default options.
FILES = {
    "alpaca_en_demo.json": (999, "instruction"),
    "alpaca_zh_demo.json": (1000, "instruction"),
    "identity.json": (91, "instruction"),
    "glaive_toolcall_en_demo.json": (300, "sharegpt"),
    "glaive_toolcall_zh_demo.json": (300, "sharegpt"),
    "v1_sft_demo.jsonl": (500, "chat"),
    "reason_tool_use_demo_50.jsonl": (50, "chat"),  # reasoning and tool_call parts: see below
    "dummy_conversation.json": (500, "sharegpt"),
    "t0_train_50k_per_template.jsonl.gz": (55185, "prompt_completion"),
}


def path_of(name: str) -> Path:
    return {"dummy_conversation.json": FASTCHAT, T0.name: T0}.get(name, LF / name)


def parse(path: Path, builder: str, **options: Any) -> pa.Table:
    con = duckdb.connect()
    query = BUILDERS[builder](roles=ROLES, **options)
    return pa.concat_tables(run_builder(con, c, query) for s in discover(str(path)) for c in read_chunks(s))


def records(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            return [json.loads(line) for line in fh]
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if path.suffix == ".json" else [json.loads(line) for line in text.splitlines()]


def msg(role: str, content: str, weight: float | None = None, *, chat: bool = True,
        reasoning: str | None = None, calls: list[str] | None = None) -> dict[str, Any]:
    """A canonical message; conversation builders (`chat`) also carry reasoning and tool calls, and
    every builder of these files image offsets."""
    base = {"role": role, "content": content, "train": None, "weight": weight}
    return {**base, "reasoning": reasoning, "calls": calls, "image_at": None} if chat else {**base, "image_at": None}


@pytest.mark.parametrize("name", sorted(FILES))
def test_each_builder_on_each_file(name: str) -> None:
    """The matching builder accepts every record; every other builder rejects every record,
    nearly always as `missing_key` (the keys differ between formats)."""
    rows, good = FILES[name]
    for builder in sorted(BUILDERS):
        reasons = Counter(parse(path_of(name), builder).column("reason").to_pylist())
        if builder == good:
            expected = {None: rows}
        else:
            expected = {"missing_key": rows}
        assert dict(reasons) == expected, (name, builder)


def test_alpaca_messages_match_python() -> None:
    for name in ("alpaca_en_demo.json", "alpaca_zh_demo.json", "identity.json"):
        recs = records(LF / name)
        got = parse(LF / name, "instruction").column("messages").to_pylist()
        want = [[msg("user", r["instruction"] + ("\n\n" + r["input"] if r["input"] else ""), chat=False),
                 msg("assistant", r["output"], chat=False)] for r in recs]
        assert got == want, name
    assert sum(bool(r["input"]) for r in records(LF / "alpaca_en_demo.json")) == 412  # README


def test_sharegpt_files_match_python() -> None:
    roles = {"human": "user", "gpt": "assistant", "function_call": "assistant", "observation": "tool"}
    for path in (LF / "glaive_toolcall_en_demo.json", LF / "glaive_toolcall_zh_demo.json", FASTCHAT):
        recs = records(path)
        got = parse(path, "sharegpt", tools_key=None).column("messages").to_pylist()
        assert got == [[msg(roles[m["from"]], m["value"]) for m in r["conversations"]] for r in recs]
    glaive = parse(LF / "glaive_toolcall_en_demo.json", "sharegpt")  # tools_key "tools" by default
    firsts = [m[0] for m in glaive.column("messages").to_pylist()]
    recs = records(LF / "glaive_toolcall_en_demo.json")
    # An empty tool list ("[]" as a JSON string in glaive) adds no system message at all.
    expected = [
        msg("system", "# Tools\n\n" + r["tools"].strip()) if r["tools"].strip() not in ("", "[]", "{}")
        else msg(roles[r["conversations"][0]["from"]], r["conversations"][0]["value"])
        for r in recs
    ]
    assert firsts == expected
    assert sum(m["role"] == "system" for m in firsts) == 191  # 109 records have no tools
    sources = Counter(m["from"] for r in recs for m in r["conversations"])
    assert sources == {"human": 746, "gpt": 746, "function_call": 211, "observation": 211}  # README
    lengths = Counter(len(m) for m in parse(FASTCHAT, "sharegpt").column("messages").to_pylist())
    assert lengths == {2: 167, 4: 166, 6: 167}  # README


def test_v1_sft_demo_loss_weight() -> None:
    path = LF / "v1_sft_demo.jsonl"
    got = parse(path, "chat", weight_key="loss_weight").column("messages").to_pylist()
    want = [[msg(m["role"], "".join(p["value"] for p in m["content"]), m["loss_weight"]) for m in r["messages"]]
            for r in records(path)]
    assert got == want
    assert Counter((m["role"], m["weight"]) for conv in got for m in conv) == {("user", 0.0): 500, ("assistant", 1.0): 500}


def test_reason_tool_use_with_all_text_like_parts() -> None:
    path = LF / "reason_tool_use_demo_50.jsonl"
    table = parse(path, "chat", text_part_types=["text", "reasoning", "tool_call"], part_separator="\n\n",
                  tools_key=None, parse_think=False)
    assert table.column("reason").null_count == 50
    got = table.column("messages").to_pylist()
    want = [[msg(m["role"], "\n\n".join(p["value"] for p in m["content"])) for m in r["messages"]]
            for r in records(path)]
    assert got == want
    assert Counter(len(m) for m in got) == {3: 28, 5: 6, 9: 12, 13: 4}  # README


def test_reason_tool_use_parts_by_default() -> None:
    """A plain chat config reads every record: reasoning and tool_call parts become the
    message's reasoning and calls; the top-level tools string is the `tools` column."""
    path = LF / "reason_tool_use_demo_50.jsonl"
    table = parse(path, "chat", template_tools=True)
    assert table.column("reason").null_count == 50
    recs = records(path)

    def parts(m: dict[str, Any], kind: str) -> list[str]:
        return [p["value"] for p in m["content"] if p["type"] == kind]

    want = [[msg(m["role"], "".join(parts(m, "text")), reasoning="".join(parts(m, "reasoning")) or None,
                 calls=parts(m, "tool_call") or None) for m in r["messages"]] for r in recs]
    assert table.column("messages").to_pylist() == want
    # An empty tool list ("[]") is no tools.
    assert table.column("tools").to_pylist() == [r["tools"].strip() if r["tools"].strip() != "[]" else None
                                                 for r in recs]
    counts = Counter((m["role"], bool(m["reasoning"]), len(m["calls"] or [])) for c in want for m in c)
    assert sum(n for (role, r, _), n in counts.items() if r) == 112  # README: 112 reasoning parts
    assert sum(k * n for (_, _, k), n in counts.items()) == 68  # README: 68 tool_call parts


def test_t0_strip_suffix_and_text_lengths() -> None:
    recs = records(T0)
    table = parse(T0, "prompt_completion", strip_suffix=EOT, domain_key="missing")
    assert table.column("reason").null_count == len(recs) == 55185
    assert table.column("domain").null_count == len(recs)
    got = table.column("messages").to_pylist()
    assert all(r["completion"].endswith(EOT) for r in recs)  # README: every completion
    assert [m[1]["content"] for m in got] == [r["completion"][: -len(EOT)] for r in recs]
    assert [m[0]["content"] for m in got] == [r["prompt"] for r in recs]
    as_text = Counter(parse(T0, "text", text_key="prompt").column("reason").to_pylist())
    short = sum(len(r["prompt"]) < 50 for r in recs)
    assert as_text == {k: v for k, v in {None: len(recs) - short, "drop:too_short": short}.items() if v}
    as_instruction = parse(T0, "instruction", response_key="completion")
    assert as_instruction.column("reason").null_count == len(recs)
