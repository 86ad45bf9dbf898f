"""`etl check-template`'s reference: what it is given (everything the builder read) and who renders it.

The conversion tests use a hand-made builder output; the transformers-vs-jinja2 tests use the
Qwen2.5 / Qwen3 tokenizers in ../shared/data and skip when it (or transformers) is absent.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest

from etl import columns as c
from etl.analysis.check_template import check_template, conversations_of
from etl.analysis.reference import (
    JINJA2_PATH,
    Conversation,
    Jinja2Renderer,
    conversation,
    load_renderer,
    tools_column,
)
from etl.config.run_config import RunConfig
from etl.pipeline.build import records_frame
from etl.tokens.chat_jinja import chat_template_source, load_config, special_tokens_map
from tests.commands.test_rough_edges import write_tiny_tokenizer

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
QWEN, QWEN3 = SHARED / "qwen2.5-tokenizer", SHARED / "qwen3-tokenizer"
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(not HAS_TRANSFORMERS, reason="needs transformers")

MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("train", pa.bool_()),
                     ("weight", pa.float64()), ("reasoning", pa.string()), ("calls", pa.list_(pa.string()))])
WEATHER = {"name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL = json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})
OPENAI_CALL = json.dumps({"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}})


def msg(role: str, content: str | None, *, reasoning: str | None = None,
        calls: list[str] | None = None) -> dict[str, Any]:
    """One message of the builder's `messages` struct."""
    return {"role": role, "content": content, "train": None, "weight": None, "reasoning": reasoning, "calls": calls}


TOOL_CHAT = [msg("user", "Weather in Paris and Oslo?"), msg("assistant", "", calls=[CALL, OPENAI_CALL]),
             msg("tool", '{"temp": 21}'), msg("tool", '{"temp": 9}'), msg("assistant", "21 and 9 degrees.")]
REASONING_CHAT = [msg("user", "2+2?"), msg("assistant", "4.", reasoning="Two and two make four.")]
PLAIN_CHAT = [msg("system", "Be terse."), msg("user", "Name a colour."), msg("assistant", "Blue.")]


def builder_output(rows: list[tuple[list[dict[str, Any]], str | None]], *, with_tools: bool = True) -> pa.Table:
    """The good rows of a builder's output: source_line, messages and (optionally) tools."""
    columns = {c.SOURCE_LINE: pa.array(range(len(rows)), pa.int64()),
               "messages": pa.array([m for m, _ in rows], pa.list_(MESSAGE))}
    if with_tools:
        columns["tools"] = pa.array([t for _, t in rows], pa.string())
    return pa.table(columns)


def converted(good: pa.Table, *, injected: tuple[int, ...] = ()) -> list[Conversation | None]:
    records = records_frame("x.jsonl", good)
    plan = pl.DataFrame({c.CONV: list(range(good.num_rows)),
                         c.INJECTED: [i in injected for i in range(good.num_rows)]}, schema_overrides={c.CONV: pl.UInt32})
    return conversations_of(records, tools_column(good), plan, "Default.")


def test_the_reference_gets_reasoning_tool_calls_and_tools() -> None:
    good = builder_output([(TOOL_CHAT, json.dumps([WEATHER])), (REASONING_CHAT, None)])
    tools_conv, reasoning_conv = converted(good, injected=(1,))
    assert tools_conv.tools == [WEATHER]
    assert tools_conv.messages[0] == {"role": "user", "content": "Weather in Paris and Oslo?"}
    assert tools_conv.messages[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]}
    assert tools_conv.messages[2] == {"role": "tool", "content": '{"temp": 21}'}
    # Absent values set no key: templates test `is defined`.
    assert reasoning_conv.tools is None
    assert reasoning_conv.messages == [{"role": "system", "content": "Default."}, {"role": "user", "content": "2+2?"},
                                       {"role": "assistant", "content": "4.",
                                        "reasoning_content": "Two and two make four."}]


def test_without_a_tools_column_no_record_has_tools() -> None:
    good = builder_output([(PLAIN_CHAT, None), (TOOL_CHAT, None)], with_tools=False)
    assert tools_column(good) == [None, None]
    assert [conv.tools for conv in converted(good)] == [None, None]
    assert converted(good)[0].messages[0] == {"role": "system", "content": "Be terse."}


def test_a_one_tool_object_and_a_bad_call() -> None:
    bad = [msg("user", "hi"), msg("assistant", None, calls=['{"arguments": {}}'])]
    good = builder_output([(PLAIN_CHAT, json.dumps(WEATHER)), (bad, None)])
    one_tool, unparsable = converted(good)
    assert one_tool.tools == [WEATHER] and unparsable is None  # counted as BAD_TOOL_JSON, not checked


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_tokenizer(tmp_path_factory.mktemp("tiny") / "tok")


CHATS = Path(__file__).resolve().parents[1] / "assets" / "tiny_chat" / "chats.jsonl"


@needs_transformers
def test_with_transformers_the_reference_is_transformers(tiny: Path) -> None:
    import transformers

    report = check_template(str(CHATS), RunConfig(tokenizer=str(tiny), template="hf"))
    assert report.reference.startswith(f"transformers {transformers.__version__} ")
    assert "apply_chat_template" in report.reference
    assert (report.examples, report.identical, report.differ_with_special_text) == (3, 2, 1)


def test_without_transformers_the_reference_is_jinja2(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    report = check_template(str(CHATS), RunConfig(tokenizer=str(tiny), template="hf"))
    assert report.reference == JINJA2_PATH
    assert (report.examples, report.identical, report.differ_with_special_text) == (3, 2, 1)


def both_paths(directory: Path, convs: list[Conversation]) -> tuple[list[list[int]], list[list[int]]]:
    """Ids of `convs` by transformers and by the jinja2 path, for one tokenizer directory."""
    from tokenizers import Tokenizer

    if not directory.exists():
        pytest.skip(f"needs {directory}")
    config = load_config(directory)
    raw = Tokenizer.from_file(str(directory / "tokenizer.json"))
    source, tokens = chat_template_source(config), special_tokens_map(config)
    jinja2 = Jinja2Renderer(source, tokens, raw)
    real = load_renderer(directory, source=source, tokens=tokens, raw=raw)
    assert real.description.startswith("transformers ")
    return real.ids(convs), jinja2.ids(convs)


@pytest.mark.shared
@needs_transformers
@pytest.mark.parametrize("directory", [QWEN, QWEN3], ids=["qwen2.5", "qwen3"])
def test_transformers_and_jinja2_give_the_same_ids(directory: Path) -> None:
    convs = [conversation(PLAIN_CHAT, None), conversation(TOOL_CHAT, json.dumps([WEATHER])),
             conversation(REASONING_CHAT, None), conversation(REASONING_CHAT[:1] + TOOL_CHAT[1:], json.dumps(WEATHER))]
    theirs, ours = both_paths(directory, convs)
    assert theirs == ours
    assert all(len(ids) > 10 for ids in theirs)


@pytest.mark.shared
@needs_transformers
def test_qwen3_renders_the_reasoning_it_is_given() -> None:
    from tokenizers import Tokenizer

    (with_reasoning, without), _ = both_paths(QWEN3, [conversation(REASONING_CHAT, None),
                                                      conversation([msg("user", "2+2?"), msg("assistant", "4.")], None)])
    text = Tokenizer.from_file(str(QWEN3 / "tokenizer.json")).decode(with_reasoning, skip_special_tokens=False)
    assert "<think>\nTwo and two make four.\n</think>" in text and len(with_reasoning) > len(without)


@pytest.mark.shared
@needs_transformers
def test_phi3_ids_equal_transformers_after_a_special_token(tmp_path: Path) -> None:
    phi3 = SHARED / "phi3-tokenizer"
    if not phi3.exists():
        pytest.skip(f"needs {phi3}")
    src = tmp_path / "chats.jsonl"
    src.write_text(json.dumps({"messages": [{"role": "user", "content": "What is 2+2?"},
                                            {"role": "assistant", "content": "4."}]}) + "\n")
    report = check_template(str(src), RunConfig(tokenizer=str(phi3), template="hf"))
    # transformers' LlamaTokenizer writes "What" after <|user|> (no "▁": its Metaspace prepends only at
    # the start of the text), raw tokenizer.json "▁What"; etl encodes as transformers builds it.
    assert (report.examples, report.identical) == (1, 1), report.first_diff
