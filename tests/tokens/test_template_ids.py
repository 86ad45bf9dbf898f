"""Every example's ids equal transformers' `apply_chat_template` of the same conversation, for hostile
contents (edge whitespace, newlines, tabs, CR, empty, special-token text, reasoning, tool calls and
results), every tokenizer family (byte-level BPE, Metaspace BPE loaded as LlamaTokenizer) and every
template that fits it: the tokenizer's own (`hf`) and the matching preset. Special-token text in
content is data to etl: such an example equals the whole rendering tokenized with that text as
text (`as_data`: the template's own tokens found where the template put them)."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from etl.analysis.check_template import CheckReport, TemplateReference, conversations_of, good_rows
from etl.analysis.reference import tools_column
from etl.columns import CONV, INPUT_IDS
from etl.config.run_config import RunConfig
from etl.ingest.discover import discover
from etl.ingest.reader import read_chunks
from etl.pipeline.build import build_examples, records_frame
from etl.pipeline.resources import build_resources
from etl.tokens.hf_pipeline import as_transformers
from etl.tokens.joins import WHITESPACE
from tests.tokens.template_ids_fixtures import TRIMMED, byte_level_chatml, metaspace_phi_style

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
EDGES = ["", " ", "  ", "\n", "\n\n", "\n\n\n", "\t", "\r", "\r\n", " \n", "\n ", " \t\n", "\u3000", "\xa0", "\x0b"]
WORDS = ["Hi", "Question 1?", "1+1=2", "über", "日本語", "'s", "x\n\ny", "a.\n", "}", "##"]
# (tokenizer, template): the tokenizer's own template, and the preset written for its family.
CASES = [("bytelevel", "hf"), ("bytelevel", "chatml"), ("trimmed", "hf"), ("metaspace", "hf"), ("metaspace", "phi3"),
         ("qwen2.5", "hf"), ("qwen2.5", "chatml"), ("qwen3", "hf"), ("phi3", "hf"), ("phi3", "phi3")]
TOOLS = {"qwen2.5", "qwen3"}  # templates that render tool calls and results


@functools.cache
def tokenizer_dir(name: str, root: str) -> Path:
    if name == "bytelevel":
        return byte_level_chatml(Path(root) / name)
    if name == "trimmed":
        return byte_level_chatml(Path(root) / name, TRIMMED)
    if name == "metaspace":
        return metaspace_phi_style(Path(root) / name)
    path = SHARED / f"{name}-tokenizer"
    if not path.is_dir():
        pytest.skip(f"needs {path}")
    return path


@functools.cache
def checker(name: str, template: str, root: str) -> tuple[Any, TemplateReference]:
    """The run's resources and transformers' reference, loaded once per case (~1-2 s)."""
    config = RunConfig(tokenizer=str(tokenizer_dir(name, root)), template=template, seq_len=1 << 30)
    ctx = build_resources(config)
    return ctx, TemplateReference(ctx)


class AsData:
    """The whole rendering tokenized with special-token text in messages as text: render with each
    such text replaced by private-use characters (so only the template's own tokens remain), split
    at those tokens, put the texts back, and encode each text between them whole, as `tokenizers`
    does with `encode_special_tokens` (whitespace an rstrip/lstrip token swallows removed; "▁" only
    at the very start for a Metaspace "first" tokenizer)."""

    def __init__(self, ref: TemplateReference, directory: Path) -> None:
        from tokenizers import AddedToken, Tokenizer

        config = json.loads((directory / "tokenizer_config.json").read_text())
        self.hf = ref.renderer.tokenizer
        self.first, self.rest = (as_transformers(Tokenizer.from_file(str(directory / "tokenizer.json")), config,
                                                 whole=whole) for whole in (True, False))
        for tok in (self.first, self.rest):
            tok.encode_special_tokens = True  # only special added tokens: Qwen's <tool_call> is not one
            tok.add_special_tokens([AddedToken(t.content, single_word=t.single_word, lstrip=t.lstrip, rstrip=t.rstrip,
                                               normalized=t.normalized, special=True)
                                    for t in tok.get_added_tokens_decoder().values() if not t.special])
        added = {t.content: t for t in self.rest.get_added_tokens_decoder().values()}
        self.added = added
        self.split = re.compile("(" + "|".join(re.escape(t) for t in sorted(added, key=len, reverse=True)) + ")")

    def ids(self, messages: list[dict[str, Any]], tools: list[Any] | None) -> list[int]:
        hidden: dict[str, str] = {}

        def hide(text: str) -> str:
            def one(m: re.Match[str]) -> str:
                key = "\uf8fe" + "".join(chr(0xE000 + int(d)) for d in str(len(hidden))) + "\uf8ff"
                hidden[key] = m.group(0)
                return key
            return self.split.sub(one, text)

        masked = json.loads(json.dumps(messages), object_hook=lambda d: {k: hide(v) if isinstance(v, str) else v
                                                                           for k, v in d.items()})
        text = self.hf.apply_chat_template(masked, tools=tools, tokenize=False)
        parts = self.split.split(text)
        ids: list[int] = []
        for i, part in enumerate(parts):
            if i % 2:
                ids.append(self.rest.token_to_id(part))
                continue
            if i and self.added[parts[i - 1]].rstrip:
                part = part.lstrip(WHITESPACE)
            if i + 1 < len(parts) and self.added[parts[i + 1]].lstrip:
                part = part.rstrip(WHITESPACE)
            for key, value in hidden.items():
                part = part.replace(key, value)
            if part:
                ids += (self.first if i == 0 else self.rest).encode(part, add_special_tokens=False).ids
        return ids


def texts(specials: list[str]) -> st.SearchStrategy[str]:
    piece = st.sampled_from(EDGES + WORDS + specials)
    return st.lists(piece, max_size=5).map("".join)


def conversations(specials: list[str], *, tools: bool, reasoning: bool) -> st.SearchStrategy[dict[str, Any]]:
    """A record: optional system, 1-3 exchanges, (reasoning) reasoning on assistants, and (tools) a
    call + results."""
    text = texts(specials)

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        messages = [{"role": "system", "content": draw(text)}] if draw(st.booleans()) else []
        for _ in range(draw(st.integers(1, 3))):
            messages.append({"role": "user", "content": draw(text)})
            if tools and draw(st.booleans()):
                call = {"name": "lookup", "arguments": {"q": draw(text)}}
                messages.append({"role": "assistant", "content": draw(text), "tool_calls": [{"function": call}]})
                messages += [{"role": "tool", "content": draw(text)} for _ in range(draw(st.integers(1, 2)))]
            answer = {"role": "assistant", "content": draw(text)}
            if reasoning and draw(st.booleans()):
                answer["reasoning_content"] = draw(text)
            messages.append(answer)
        return {"messages": messages}

    return build()


@pytest.mark.parametrize(("name", "template"), CASES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(data=st.data())
def test_ids_equal_apply_chat_template(name: str, template: str, data: st.DataObject,
                                       tmp_path_factory: pytest.TempPathFactory) -> None:
    root = str(tmp_path_factory.getbasetemp() / "template_ids")
    ctx, ref = checker(name, template, root)
    # A preset renders reasoning and tools its own way, which the tokenizer's template (the reference)
    # need not share: those are checked with the tokenizer's own template only.
    own = template == "hf"
    records = data.draw(st.lists(conversations(list(ref.specials), tools=own and name in TOOLS, reasoning=own),
                                 min_size=1, max_size=8))
    src = tmp_path_factory.mktemp("chats") / "chats.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    report = CheckReport(template=template, tokenizer=name, reference="", default_system=None, template_notes="",
                         input_type="chat")
    checked = 0
    for source in discover(str(src)):
        for raw in read_chunks(source, chunk_bytes=1 << 20):
            good = good_rows(raw, ctx, ctx.builder_query(), report, room=None)
            if good.num_rows:
                checked += check_chunk(records_frame(source.name, good), tools_column(good), ctx, ref,
                                       AsData(ref, tokenizer_dir(name, root)))
    assert checked + sum(report.rejected.values()) == len(records)


def check_chunk(frame: Any, tools: list[str | None], ctx: Any, ref: TemplateReference, as_data: AsData) -> int:
    """Each example against transformers' ids of the same conversation (its default system message
    included); one whose messages spell special tokens against `AsData`."""
    examples, plan = build_examples(frame, ctx)
    ours = dict(zip(examples[CONV].to_list(), examples[INPUT_IDS].to_list(), strict=True))
    items = conversations_of(frame, tools, plan, ctx.config.default_system)
    for conv, item in zip(frame[CONV].to_list(), items, strict=True):
        assert item is not None
        ids = ours.get(conv, [])
        special = any(s in json.dumps(item.messages, ensure_ascii=False) for s in ref.specials)  # tool calls too
        theirs = as_data.ids(item.messages, item.tools) if special else ref.encode([item])[0]
        assert ids == theirs, json.dumps(item.messages, ensure_ascii=False)
    return len(items)


HOSTILE = Path(__file__).resolve().parents[1] / "assets" / "hostile" / "whitespace.jsonl"


@pytest.mark.parametrize("name", ["bytelevel", "trimmed", "metaspace", "qwen2.5", "qwen3", "phi3"])
def test_check_template_is_exact_on_a_hostile_whitespace_set(name: str, tmp_path_factory: pytest.TempPathFactory
                                                            ) -> None:
    """136 conversations whose contents start and end with spaces, newlines, tabs, CR, U+3000, NBSP,
    VT and U+001C (or are only that): every one identical to apply_chat_template's ids."""
    from etl.analysis.check_template import check_template

    directory = tokenizer_dir(name, str(tmp_path_factory.getbasetemp() / "template_ids"))
    report = check_template(str(HOSTILE), RunConfig(tokenizer=str(directory)))
    assert (report.examples, report.identical) == (136, 136), report.first_diff
