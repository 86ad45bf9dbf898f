"""Reasoning rendered by the think format, kept and masked as the options say (hand-worked ids).

The byte tokenizer makes the golden ids readable: text is its UTF-8 bytes, and the ngpt
markers are 256 (system), 257 (user), 258 (assistant) and 259 (end of turn).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from etl.config.run_config import MaskOptions, RunConfig
from etl.pipeline.build import build_examples, records_frame
from etl.pipeline.resources import build_resources

SYS, USR, ASST, EOT = 256, 257, 258, 259
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("train", pa.bool_()),
                     ("weight", pa.float64()), ("reasoning", pa.string())])


def b(text: str) -> list[int]:
    return list(text.encode())


def run(conv: list[dict[str, object]], **mask: object) -> tuple[list[int], list[bool]]:
    config = RunConfig(default_system="S", mask=MaskOptions().replace(**mask))
    ctx = build_resources(config)
    assert [ctx.tokenizer.special_id(t) for t in ctx.template.template.special_tokens] == [SYS, USR, ASST, EOT]
    msgs = [{"train": None, "weight": None, "reasoning": None, **m} for m in conv]
    good = pa.table({"source_line": pa.array([0], pa.int64()), "messages": pa.array([msgs], pa.list_(MESSAGE))})
    examples, _ = build_examples(records_frame("mem.jsonl", good), ctx)
    row = examples.row(0, named=True)
    return row["input_ids"], row["loss_mask"]


ONE = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "C", "reasoning": "R"}]
HEAD = [SYS, *b("S"), EOT, USR, *b("U"), EOT, ASST]
THINK = b("<think>\nR\n</think>\n\n")


def test_reasoning_renders_as_think_block_and_trains_by_default() -> None:
    ids, mask = run(ONE)
    assert ids == HEAD + THINK + b("C") + [EOT]
    assert mask == [False] * len(HEAD) + [True] * (len(THINK) + 2)


def test_reasoning_untrained_when_asked() -> None:
    ids, mask = run(ONE, train_reasoning=False)
    assert ids == HEAD + THINK + b("C") + [EOT]
    assert mask == [False] * (len(HEAD) + len(THINK)) + [True, True]


def test_reasoning_none_drops_the_block() -> None:
    assert run(ONE, reasoning_turns="none")[0] == HEAD + b("C") + [EOT]


def test_reasoning_last_keeps_it_after_the_last_user_turn_only() -> None:
    conv = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A", "reasoning": "X"},
            {"role": "user", "content": "V"}, {"role": "assistant", "content": "C", "reasoning": "R"}]
    middle = [*b("A"), EOT, USR, *b("V"), EOT, ASST]
    assert run(conv, reasoning_turns="last")[0] == HEAD + middle + THINK + b("C") + [EOT]
    assert run(conv)[0] == HEAD + b("<think>\nX\n</think>\n\n") + middle + THINK + b("C") + [EOT]


def test_reasoning_of_a_user_message_is_not_rendered() -> None:
    conv = [{"role": "user", "content": "U", "reasoning": "no"}, {"role": "assistant", "content": "C"}]
    assert run(conv)[0] == HEAD + b("C") + [EOT]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "thinking"])
def test_reasoning_fields_through_etl_run(tmp_path: Path, field: str) -> None:
    """`reasoning_content` (and its aliases) on a message, read by the chat builder by default."""
    import json

    from etl.pipeline.run import run as etl_run

    src = tmp_path / "in.jsonl"
    rec = {"messages": [{"role": "user", "content": "U"}, {"role": "assistant", "content": "C", field: "R"}]}
    src.write_text(json.dumps(rec) + "\n", encoding="utf-8")
    etl_run(str(src), str(tmp_path / "out"), RunConfig(default_system="S"))
    import pyarrow.parquet as pq

    table = pq.read_table(next((tmp_path / "out" / "data" / "train").glob("*.parquet")))
    assert table["input_ids"][0].as_py() == HEAD + THINK + b("C") + [EOT]


def test_inline_think_in_content_is_parsed_then_rendered(tmp_path: Path) -> None:
    """Distilled data writes `<think>...</think>` into the content: parsed like Qwen3's template,
    then rendered by the format (so the block's markers are structure, not user text)."""
    import json

    import pyarrow.parquet as pq

    from etl.pipeline.run import run as etl_run

    src = tmp_path / "in.jsonl"
    rec = {"messages": [{"role": "user", "content": "U"},
                        {"role": "assistant", "content": "<think>\n\nR\n</think>\n\nC"}]}
    src.write_text(json.dumps(rec) + "\n", encoding="utf-8")
    etl_run(str(src), str(tmp_path / "out"), RunConfig(default_system="S", mask=MaskOptions(train_reasoning=False)))
    table = pq.read_table(next((tmp_path / "out" / "data" / "train").glob("*.parquet")))
    assert table["input_ids"][0].as_py() == HEAD + THINK + b("C") + [EOT]
    assert table["loss_mask"][0].as_py() == [False] * (len(HEAD) + len(THINK)) + [True, True]
