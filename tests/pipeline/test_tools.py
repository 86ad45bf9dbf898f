"""Tools, tool calls and tool results rendered by the template, end to end through `etl run`.

Golden values are hand-written texts in Qwen3's rendering (what its chat_template prints for
the same messages); the byte tokenizer makes their ids the text's bytes, with chatml's
`<|im_start|>` / `<|im_end|>` as ids (`<tool_call>` is text: the byte vocabulary has no such
token). The mask is read back as the texts of the trained spans.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.config.run_config import RunConfig
from etl.pipeline.resources import build_resources
from etl.pipeline.run import run as etl_run
from etl.pipeline.tools import encode_calls
from etl.tokens.tokenizer import encode_template_text
from etl.tokens.tool_format import QWEN_TOOLS, resolve_tools
from etl.tokens.tool_json import call_parts

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
LIST = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
        "function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}'
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
        "<args-json-object>}\n</tool_call>")
CALL = {"type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": "é"}'}}  # arguments as JSON text
CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": "é"}}\n</tool_call>'
AGENT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Add twice."},
    {"role": "assistant", "content": "Sure.", "tool_calls": [CALL, {"name": "add", "arguments": {}}]},
    {"role": "tool", "content": "3"},
    {"role": "tool", "content": "{}"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": "4"},
    {"role": "assistant", "content": "Done."},
]
AGENT_TEXT = (
    "<|im_start|>system\nBe brief.\n\n" + LIST + "<|im_end|>\n"
    "<|im_start|>user\nAdd twice.<|im_end|>\n"
    "<|im_start|>assistant\nSure.\n" + CALL_TEXT + '\n<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>'
    "<|im_end|>\n"
    "<|im_start|>user\n<tool_response>\n3\n</tool_response>\n<tool_response>\n{}\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n" + CALL_TEXT + "<|im_end|>\n"
    "<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nDone.<|im_end|>\n"
)
# What trains: each assistant turn's content, calls and end-of-turn.
AGENT_TRAINED = ["Sure.\n" + CALL_TEXT + '\n<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call><|im_end|>',
                 CALL_TEXT + "<|im_end|>", "Done.<|im_end|>"]


def _run(tmp_path: Path, records: list[dict[str, object]], **config: object) -> tuple[pa.Table, RunConfig]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    cfg = RunConfig(template="chatml", tokenizer="bytes", **config)  # type: ignore[arg-type]
    etl_run(str(src), str(tmp_path / "out"), cfg)
    return pq.read_table(min((tmp_path / "out" / "data" / "train").glob("*.parquet"))), cfg


def _ids(cfg: RunConfig, text: str) -> list[int]:
    return encode_template_text(build_resources(cfg).tokenizer, text, ("<|im_start|>", "<|im_end|>"))


def _spans(cfg: RunConfig, ids: list[int], mask: list[bool]) -> list[str]:
    """The decoded runs of trained tokens (bytes below 256, chatml's markers above)."""
    names = {i: t for t, i in build_resources(cfg).template.special_ids.items()}

    def decode(run: list[int]) -> str:
        return b"".join(names[i].encode() if i in names else bytes([i]) for i in run).decode()

    edges = np.flatnonzero(np.diff(np.concatenate([[0], np.asarray(mask, np.int8), [0]])))
    return [decode(ids[a:b]) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def test_agent_conversation_renders_as_qwen3_and_trains_the_assistant(tmp_path: Path) -> None:
    table, cfg = _run(tmp_path, [{"messages": AGENT, "tools": TOOLS}], default_system=None)
    ids, mask = table["input_ids"][0].as_py(), table["loss_mask"][0].as_py()
    assert ids == _ids(cfg, AGENT_TEXT)
    assert _spans(cfg, ids, mask) == AGENT_TRAINED


def test_tools_without_a_system_message_open_a_system_turn(tmp_path: Path) -> None:
    convo = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "", "tool_calls": [CALL]}]
    tail = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n" + CALL_TEXT + "<|im_end|>\n"
    table, cfg = _run(tmp_path / "a", [{"messages": convo, "tools": TOOLS}], default_system=None)
    assert table["input_ids"][0].as_py() == _ids(cfg, "<|im_start|>system\n" + LIST + "<|im_end|>\n" + tail)
    # With a default system prompt, the list follows it as it follows any system text.
    table, cfg = _run(tmp_path / "b", [{"messages": convo, "tools": TOOLS}], default_system="S")
    assert table["input_ids"][0].as_py() == _ids(cfg, "<|im_start|>system\nS\n\n" + LIST + "<|im_end|>\n" + tail)


def test_a_record_without_tools_is_unchanged_by_the_format(tmp_path: Path) -> None:
    convo = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    table, cfg = _run(tmp_path, [{"messages": convo}], default_system="S")
    text = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n"
    assert table["input_ids"][0].as_py() == _ids(cfg, text)


def test_structure_text_in_a_tool_result_stays_text(tmp_path: Path) -> None:
    """A tool result that spells `</tool_response>` does not close the block (bytes: all text anyway);
    the ids are still those of the whole rendering, and the result is not trained."""
    convo = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "", "tool_calls": [CALL]},
             {"role": "tool", "content": "x</tool_response>"}, {"role": "assistant", "content": "A"}]
    table, cfg = _run(tmp_path, [{"messages": convo}], default_system=None)
    ids, mask = table["input_ids"][0].as_py(), table["loss_mask"][0].as_py()
    assert _spans(cfg, ids, mask) == [CALL_TEXT + "<|im_end|>", "A<|im_end|>"]


def _reference_calls(calls: list[list[str] | None], nonempty: np.ndarray, tok: object, fmt: object) -> list[list[int]]:
    """Per turn, per call, in Python: what `encode_calls` builds with one gather."""
    out = []
    for turn, texts in enumerate(calls):
        ids: list[int] = []
        for i, text in enumerate(texts or []):
            if i:
                ids += fmt.lead_ids  # type: ignore[attr-defined]
            elif not nonempty[turn]:
                ids += fmt.lead_empty_ids  # type: ignore[attr-defined]
            elif not fmt.content_glue:  # type: ignore[attr-defined]
                ids += fmt.lead_ids  # type: ignore[attr-defined]
            name, args = call_parts(text)
            body = fmt.call_pre + name + fmt.call_mid + args + fmt.call_post  # type: ignore[attr-defined]
            ids += fmt.call_prefix + tok.encode_texts(pa.array([body]))[0].as_py() + fmt.call_suffix  # type: ignore[attr-defined]
        out.append(ids)
    return out


NAMES = st.sampled_from(["f", "g_2", "é"])
CALLS = st.lists(st.none() | st.lists(st.builds(lambda n, a: json.dumps({"name": n, "arguments": {"x": a}}),
                                                NAMES, st.integers(0, 9)), max_size=3), max_size=6)


@settings(max_examples=60, deadline=None)
@given(calls=CALLS, data=st.data())
def test_encode_calls_equals_a_per_call_loop(calls: list[list[str] | None], data: st.DataObject) -> None:
    ctx = build_resources(RunConfig(template="chatml", tokenizer="bytes"))
    nonempty = np.asarray(data.draw(st.lists(st.booleans(), min_size=len(calls), max_size=len(calls))), bool)
    for glue in (True, False):
        fmt = resolve_tools(QWEN_TOOLS, ctx.tokenizer, ("<|im_start|>", "<|im_end|>"))
        if not glue:  # a format whose call opens with text: the lead is ids before the first call
            fmt = type(fmt)(**{**fmt.__dict__, "content_glue": "", "call_prefix": [7, 8]})
        got = encode_calls(ctx.tokenizer.encode_texts, pa.array(calls, pa.list_(pa.string())), nonempty, fmt)
        assert got.to_pylist() == _reference_calls(calls, nonempty, ctx.tokenizer, fmt)
