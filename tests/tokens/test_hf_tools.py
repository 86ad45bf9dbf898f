"""`--template hf` on templates that vary by position: reasoning blocks, tools, calls, results.

`agent` is a tokenizer directory written here: a byte-level BPE without merges (every byte one
token), chatml's markers as special tokens, Qwen's `<tool_call>`... and `<think>` as non-special
added tokens, and a compact chat_template of Qwen3's shape written for this test. Its expected
strings are hand-read from that template; check-template then compares whole conversations
with the template's own rendering (jinja2 path). The Qwen2.5 / Qwen3 tests use ../shared/data.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from etl.analysis.check_template import check_template
from etl.config.build import config_from_dict
from etl.config.run_config import RunConfig
from etl.tokens.hf_template import resolve_template_name
from etl.tokens.loading import load_tokenizer
from etl.tokens.templates import ReasoningFormat
from etl.tokens.tool_format import ToolFormat

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
DEMO = SHARED / "llamafactory-demo"
STRUCTURE = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

# Qwen3's logic in brief: tools listed in the system turn, reasoning after the last user turn
# (an empty block on the final turn), calls after the content, results grouped in a user turn.
TEMPLATE = r"""{%- set ns = namespace(last=-1) -%}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor -%}
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' -}}{% endif -%}
  {{- '# Tools\n<tools>' -}}
  {%- for t in tools %}{{- '\n' + (t | tojson) -}}{% endfor -%}
  {{- '\n</tools><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
  {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
  {%- if m.role == 'user' -%}
    {{- '<|im_start|>user\n' + m.content + '<|im_end|>\n' -}}
  {%- elif m.role == 'assistant' -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if loop.index0 > ns.last and (loop.last or m.reasoning_content) -%}
      {{- '<think>\n' + (m.reasoning_content or '').strip('\n') + '\n</think>\n\n' -}}
    {%- endif -%}
    {{- m.content -}}
    {%- for c in m.tool_calls or [] -%}
      {%- if m.content or not loop.first %}{{- '\n' -}}{% endif -%}
      {%- set f = c.function if c.function is defined else c -%}
      {{- '<tool_call>\n{"name": "' + f.name + '", "arguments": ' + (f.arguments | tojson) + '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- elif m.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' -}}{% endif -%}
    {{- '\n<tool_response>\n' + m.content + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' -}}{% endif -%}
  {%- endif -%}
{%- endfor -%}"""


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    out = tmp_path_factory.mktemp("agent")
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in STRUCTURE])
    tok.save(str(out / "tokenizer.json"))
    config = {"chat_template": TEMPLATE, "eos_token": "<|im_end|>", "bos_token": None}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def test_derived_strings(agent: Path) -> None:
    template = resolve_template_name("hf", load_tokenizer(agent))
    assert template.reasoning == ReasoningFormat(keep="last", empty_last=True)
    assert template.tools == ToolFormat(
        system_glue="\n\n# Tools\n<tools>", no_system="# Tools\n<tools>", tool_before="\n", list_after="\n</tools>",
        call_lead="\n", call_lead_empty="", call_open='<tool_call>\n{"name": "', call_mid='", "arguments": ',
        call_close="}\n</tool_call>", result_first="<|im_start|>user\n<tool_response>\n",
        result_next="\n<tool_response>\n", result_end="\n</tool_response>",
        result_last_end="\n</tool_response><|im_end|>", result_sep="\n",
        structure=("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"))
    assert template.roles["assistant"].header == "<|im_start|>assistant\n"  # the think block is not a header


CALL = {"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
AGENT_CHATS = [
    {"messages": [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]},
    {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                  {"role": "assistant", "content": "", "reasoning_content": "R1", "tool_calls": [CALL, CALL]},
                  {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}, {"role": "tool", "content": "3"},
                  {"role": "assistant", "content": "B", "tool_calls": [CALL]}, {"role": "tool", "content": "4"},
                  {"role": "assistant", "content": "C", "reasoning_content": "\nR2\n"}],
     "tools": [{"name": "f", "parameters": {}}]},
    {"messages": [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A", "reasoning_content": "old"},
                  {"role": "user", "content": "V"}, {"role": "assistant", "content": "<think>R</think>C"}],
     "tools": [{"name": "f"}]},
]


def test_check_template_agent_conversations(agent: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # the jinja2 reference: a hand-made tokenizer dir
    src = tmp_path / "agent.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in AGENT_CHATS))
    report = check_template(str(src), RunConfig(tokenizer=str(agent), template="hf", default_system=None))
    assert (report.examples, report.identical) == (3, 3), report.first_diff


def _check(data: Path, tokenizer: str, template: str, doc: dict[str, object]) -> object:
    if not (SHARED / tokenizer).exists() or not data.exists():
        pytest.skip(f"needs {data} and {SHARED / tokenizer}")
    doc = {**doc, "tokenizer": str(SHARED / tokenizer), "template": template}
    return check_template(str(data), RunConfig(**config_from_dict(doc)), limit=100)


SHAREGPT = {"input": {"type": "sharegpt"}}  # glaive: function_call / observation roles, a tools field


@pytest.mark.shared
@pytest.mark.parametrize(("tokenizer", "template"), [("qwen2.5-tokenizer", "chatml"), ("qwen2.5-tokenizer", "hf"),
                                                     ("qwen3-tokenizer", "hf")])
def test_glaive_tool_calling_equals_the_chat_template(tokenizer: str, template: str) -> None:
    report = _check(DEMO / "glaive_toolcall_en_demo.json", tokenizer, template, SHAREGPT)
    assert report.examples == 100 and report.identical == 100, report.first_diff


@pytest.mark.shared
def test_qwen3_reasoning_and_tools_equal_the_chat_template() -> None:
    """Every difference is special-token text in content, which etl encodes as text on purpose."""
    report = _check(DEMO / "reason_tool_use_demo_50.jsonl", "qwen3-tokenizer", "hf", {"input": {"type": "chat"}})
    assert report.examples == 50 and report.identical >= 48, report.first_diff
    assert report.identical + report.differ_with_special_text == report.examples
