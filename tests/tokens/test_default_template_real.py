"""With no --template, `etl run --tokenizer DIR` gives transformers' `apply_chat_template` ids.

For Qwen2.5 and Qwen3 (../shared/data; skipped when absent, or without transformers): 50 hh-rlhf
dialogues (transcript input), 50 gsm8k problems (instruction input) and the 50 records of
LLaMA-Factory's reasoning-and-tools demo (reasoning, tool calls, tool results, tools) run with
default flags; every row whose messages spell no added token (content is data for etl, control
for transformers) must equal `apply_chat_template(messages, tools=..., tokenize=True)`, and its
loss mask must cover exactly the assistant turns: from after `<|im_start|>assistant\\n` to its
`<|im_end|>` inclusive (Qwen's templates have no `{% generation %}` block to ask transformers).
The messages are built here from the raw records, not from what etl parsed.
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from etl.cli import main

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
RECORDS = 50
NO_TRUNCATION = 32768  # tokens: longer than any record used here

pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason="needs ../shared/data")
transformers = pytest.importorskip("transformers")


def hh_messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    """HH-RLHF's `chosen` text cut at its role markers, each turn stripped (the transcript input's rule)."""
    pieces = re.split(r"(\n\nHuman:|\n\nAssistant:)", record["chosen"])
    return [{"role": "user" if mark == "\n\nHuman:" else "assistant", "content": text.strip()}
            for mark, text in zip(pieces[1::2], pieces[2::2], strict=True)]


def gsm8k_messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": record["question"]}, {"role": "assistant", "content": record["answer"]}]


def demo_messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    """LLaMA-Factory's typed content parts as the message keys transformers' templates read."""
    out = []
    for message in record["messages"]:
        parts = message["content"]
        item = {"role": message["role"], "content": "".join(p["value"] for p in parts if p["type"] == "text")}
        if reasoning := [p["value"] for p in parts if p["type"] == "reasoning"]:
            item["reasoning_content"] = "".join(reasoning)
        if calls := [json.loads(p["value"]) for p in parts if p["type"] == "tool_call"]:
            item["tool_calls"] = [{"type": "function", "function": call} for call in calls]
        out.append(item)
    return out


# name -> (input file, the config's input section, messages of a record)
DATASETS = {
    "hh": (SHARED / "hh-rlhf" / "harmless-base-test.jsonl.gz", {"type": "transcript", "text_key": "chosen"},
           hh_messages),
    "gsm8k": (SHARED / "gsm8k" / "train.jsonl", {"type": "instruction", "prompt_key": "question",
                                                 "response_key": "answer"}, gsm8k_messages),
    "demo": (SHARED / "llamafactory-demo" / "reason_tool_use_demo_50.jsonl", {"type": "chat"}, demo_messages),
}


@pytest.fixture(scope="module", params=["qwen2.5", "qwen3"])
def tokenizer(request: pytest.FixtureRequest) -> tuple[Path, Any]:
    folder = SHARED / f"{request.param}-tokenizer"
    return folder, transformers.AutoTokenizer.from_pretrained(folder)


def assistant_turns(ids: list[int], reference: Any) -> list[bool]:
    """True on the tokens of each assistant turn after its `<|im_start|>assistant\\n`, its `<|im_end|>` included."""
    start, end = reference.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    header = [start, *reference.encode("assistant\n", add_special_tokens=False)]
    mask, inside, i = [False] * len(ids), False, 0
    while i < len(ids):
        if not inside and ids[i : i + len(header)] == header:
            inside, i = True, i + len(header)
            continue
        mask[i] = inside
        inside = inside and ids[i] != end
        i += 1
    return mask


@pytest.mark.parametrize("dataset", list(DATASETS))
def test_default_flags_give_apply_chat_template(tokenizer: tuple[Path, Any], dataset: str, tmp_path: Path) -> None:
    folder, reference = tokenizer
    path, input_section, messages_of = DATASETS[dataset]
    with (gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")) as f:
        lines = list(itertools.islice(f, RECORDS))
    src, config = tmp_path / f"{dataset}.jsonl", tmp_path / "config.json"
    src.write_text("".join(lines), encoding="utf-8")
    config.write_text(json.dumps({"input": input_section, "seq_len": NO_TRUNCATION}))  # no template
    assert main(["run", str(src), str(tmp_path / "out"), "--config", str(config), "--tokenizer", str(folder),
                 "--quiet"]) == 0
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["config"]["template"] == "hf"
    rows = {row["source_line"]: row for row in pq.read_table(tmp_path / "out" / "data").to_pylist()}
    added = [t.content for t in reference.added_tokens_decoder.values()]
    checked = 0
    for line, text in enumerate(lines):
        record = json.loads(text)
        messages = messages_of(record)
        if any(token in (m["content"] + m.get("reasoning_content", "")) for m in messages for token in added):
            continue  # special-token text in content: text to etl, control to transformers, on purpose
        tools = json.loads(record["tools"]) if record.get("tools") else None
        ids = list(reference.apply_chat_template(messages, tools=tools, tokenize=True)["input_ids"])
        row = rows[line]
        assert row["input_ids"] == ids, f"{dataset} record {line}"
        assert [bool(m) for m in row["loss_mask"]] == assistant_turns(ids, reference), f"{dataset} record {line}"
        checked += 1
    assert checked >= RECORDS - 2  # the demo has two records that spell </think> in their content
