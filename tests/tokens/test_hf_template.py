"""Template `hf` (derived from a chat_template) and `etl check-template`.

The core tests use `tests/assets/tiny_chat/`: a hand-written tokenizer_config.json whose
chat_template has a bos, a default system prompt, `<|role|>...<|end|>\\n` turns, an eos and no
tool role, plus a byte-level tokenizer.json built here with the matching added tokens.
Qwen2.5 / Phi-3 tests use ../shared/data and skip when it is absent.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sys
from pathlib import Path

import jinja2
import pytest

from etl.analysis.check_template import check_template
from etl.cli import main
from etl.config.run_config import RunConfig
from etl.errors import EtlError
from etl.tokens.chat_jinja import render
from etl.tokens.hf_probe import AddedToken, Unsupported, split_tail, whitespace_rules
from etl.tokens.hf_template import (
    load_template_and_tokenizer,
    resolve_template_name,
    template_from_hf,
)
from etl.tokens.loading import load_tokenizer
from etl.tokens.templates import PRESETS, RoleFormat, resolve_template
from etl.tokens.tool_format import QWEN_TOOLS

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "tiny_chat"
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
QWEN, PHI3 = SHARED / "qwen2.5-tokenizer", SHARED / "phi3-tokenizer"
TINY_SPECIALS = ["<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer directory: the asset config + a byte-level BPE (every byte one token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    out = tmp_path_factory.mktemp("tiny_chat")
    shutil.copy(ASSETS / "tokenizer_config.json", out)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(TINY_SPECIALS)
    tok.save(str(out / "tokenizer.json"))
    return out


def test_tiny_template_strings(tiny: Path) -> None:
    template = resolve_template_name("hf", load_tokenizer(tiny))
    for role in ("system", "user", "assistant"):
        assert template.roles[role].header == f"<|{role}|>"
        assert (template.roles[role].end, template.roles[role].sep) == ("<|end|>", "\n")
    assert "tool" not in template.roles and "tiny has no tool role" in template.notes
    assert (template.bos, template.eos, template.eot) == ("<|bos|>", "<|eos|>", "<|end|>")
    assert template.default_system == "You are tiny."  # injected text is not part of any header
    assert set(template.special_tokens) == set(TINY_SPECIALS)


def test_tiny_template_from_config_dict_and_ids(tiny: Path) -> None:
    tokenizer = load_tokenizer(tiny)
    config = json.loads((tiny / "tokenizer_config.json").read_text())
    template = template_from_hf(config, tokenizer=tokenizer)
    assert template == template_from_hf(tiny, tokenizer=tokenizer)
    ids = resolve_template(template, tokenizer)
    assert ids.header["user"] == [tokenizer.special_id("<|user|>")]
    assert ids.sep["user"] == tokenizer.encode("\n") and len(ids.sep["user"]) == 1
    assert ids.bos == [tokenizer.special_id("<|bos|>")] and ids.eos == [tokenizer.special_id("<|eos|>")]


def test_check_template_cli_on_tiny(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-template", str(ASSETS / "chats.jsonl"), "--tokenizer", str(tiny), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["examples"] == 3 and report["rejected"] == {"unknown_role": 1}
    # The third chat writes "<|end|>" as text: etl encodes it as text, the reference as control.
    assert (report["identical"], report["identical_loose"], report["differ_with_special_text"]) == (2, 2, 1)
    diff = report["first_diff"]
    assert diff["id"] == "chats.jsonl:2"
    row = next(r for r in diff["rows"] if r["differs"])
    assert row["reference_piece"] == "<|end|>" and row["pipeline_piece"] == "<"


def test_check_template_text_output(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-template", str(ASSETS / "chats.jsonl"), "--tokenizer", str(tiny), "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  examples checked +2$", out, re.MULTILINE)
    assert re.search(r"^  identical ids +2  100.0%$", out, re.MULTILINE)
    assert "verdict: template hf gives the chat_template's ids on every example" in out
    assert "first difference" not in out


def test_check_template_without_default_system_lets_the_template_inject_its_own(tiny: Path) -> None:
    report = check_template(str(ASSETS / "chats.jsonl"), RunConfig(tokenizer=str(tiny), template="hf",
                                                                   default_system=None), limit=2)
    # Chat 0 has a system message; chat 1 gets "You are tiny." from the template, nothing from etl.
    assert (report.examples, report.identical) == (2, 1)


def test_no_chat_template_is_one_clear_line(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(tiny, bare)
    config = json.loads((bare / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    assert main(["check-template", str(ASSETS / "chats.jsonl"), "--tokenizer", str(bare)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no chat_template" in err and "Traceback" not in err


# The first user turn is rendered differently from later ones (position-dependent).
POSITIONAL = ("{% for m in messages %}{% if m.role == 'user' and loop.index0 > 1 %}<|bos|>{% endif %}"
              "<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}")
NO_END_TOKEN = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
DROPS_SYSTEM = ("{% for m in messages %}{% if m.role != 'system' %}<|{{ m.role }}|>{{ m.content }}<|end|>"
                "{% endif %}{% endfor %}")


@pytest.mark.parametrize(
    ("template", "role", "why"),
    [
        (POSITIONAL, "system", "does not end with the user header"),
        (NO_END_TOKEN, "assistant", "no special token"),
        (DROPS_SYSTEM, "system", "does not render the content"),
    ],
)
def test_inexpressible_templates_name_the_role(tiny: Path, template: str, role: str, why: str) -> None:
    with pytest.raises(EtlError, match=f"not expressible.*role {role}: .*{why}"):
        template_from_hf({"chat_template": template}, tokenizer=load_tokenizer(tiny))


def test_hf_needs_a_tokenizer_directory_and_presets_resolve() -> None:
    with pytest.raises(EtlError, match="template hf needs a Hugging Face tokenizer directory"):
        load_template_and_tokenizer("hf", tokenizer_spec="bytes")
    template, tokenizer = load_template_and_tokenizer("chatml", tokenizer_spec="bytes")
    assert template is PRESETS["chatml"] and tokenizer.special_id("<|im_start|>") is not None
    with pytest.raises(EtlError, match="choose one of: .*hf"):
        resolve_template_name("nope", tokenizer)


def test_whitespace_rules_and_split_tail() -> None:
    normalize = whitespace_rules([AddedToken("<|end|>", True, False, True), AddedToken("<x>", False, True, False)])
    assert normalize("<|end|>\n <|user|>\nHi  <x>") == "<|end|><|user|>\nHi<x>"
    assert split_tail("<|end|>\n", ["<|end|>"], role="user") == ("<|end|>", "\n", "<|end|>")
    assert split_tail(" [/INST]", ["<|end|>"], role="user") == (" [/INST]", "", None)
    with pytest.raises(Unsupported, match="role assistant"):
        split_tail("\n", ["<|end|>"], role="assistant")


def test_jinja_environment_matches_transformers() -> None:
    source = ("{% for m in messages %}{% generation %}{{ m.content | tojson }}{% endgeneration %}\n"
              "{% endfor %}{% if not messages %}{{ raise_exception('empty') }}{% endif %}")
    # trim_blocks drops the newline after a block tag; tojson keeps non-ASCII (transformers' filter).
    assert render(source, [{"role": "user", "content": "é"}], tokens={}) == '"é"'
    with pytest.raises(jinja2.TemplateError, match="empty"):
        render(source, [], tokens={})


@pytest.mark.shared
@pytest.mark.skipif(not QWEN.exists(), reason="needs ../shared/data/qwen2.5-tokenizer")
def test_qwen25_template_strings() -> None:
    tokenizer = load_tokenizer(QWEN)
    template = resolve_template_name("hf", tokenizer)
    for role in ("system", "user", "assistant"):
        assert template.roles[role].header == f"<|im_start|>{role}\n"
        assert (template.roles[role].end, template.roles[role].sep) == ("<|im_end|>", "\n")
    assert (template.bos, template.eos, template.eot) == ("", "", "<|im_end|>")
    assert template.special_tokens == ("<|im_start|>", "<|im_end|>")
    assert template.default_system == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    # Tools: Qwen2.5's format, derived and checked; a lone result's strings are the tool role's.
    assert template.tools == dataclasses.replace(QWEN_TOOLS, no_system=template.default_system + QWEN_TOOLS.system_glue,
                                                 structure=("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"))
    assert template.roles["tool"] == RoleFormat("<|im_start|>user\n<tool_response>\n", "\n</tool_response><|im_end|>", "\n")
    assert template.reasoning.keep == "none" and "renders no reasoning_content" in template.notes
    ids = resolve_template(template, tokenizer)
    assert (ids.header["user"], ids.end["assistant"], ids.sep["assistant"]) == ([151644, 872, 198], [151645], [198])


@pytest.mark.shared
@pytest.mark.skipif(not PHI3.exists(), reason="needs ../shared/data/phi3-tokenizer")
def test_phi3_template_strings() -> None:
    tokenizer = load_tokenizer(PHI3)
    template = resolve_template_name("hf", tokenizer)
    # The chat_template writes "<|user|>\n" and "<|end|>\n"; these tokens have rstrip=true, so
    # the tokenizer drops that "\n" and the derived strings leave it out.
    for role in ("system", "user", "assistant"):
        assert (template.roles[role].header, template.roles[role].end, template.roles[role].sep) == (
            f"<|{role}|>", "<|end|>", "")
    assert (template.bos, template.eos, template.eot, template.default_system) == ("", "<|endoftext|>", "<|end|>", None)
    ids = resolve_template(template, tokenizer)
    assert (ids.header["user"], ids.end["user"], ids.eos) == ([32010], [32007], [32000])


@pytest.mark.shared
@pytest.mark.parametrize("tokenizer", [QWEN, PHI3], ids=["qwen2.5", "phi3"])
@pytest.mark.parametrize("reference", ["transformers", "raw tokenizers"])
def test_real_templates_match_the_whole_rendering(tokenizer: Path, reference: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    if not tokenizer.exists():
        pytest.skip(f"needs {tokenizer}")
    if reference != "transformers":  # the jinja2 + raw tokenizers path (tokenizer.json rebuilt as transformers does)
        monkeypatch.setitem(sys.modules, "transformers", None)
    chats = [
        [("user", "What is 2+2?"), ("assistant", "4.")],
        [("system", "Be terse."), ("user", "Name a colour."), ("assistant", "Blue."),
         ("user", "Another, with a list:\n- one"), ("assistant", "Red.\n\nDone.")],
        # Joins: Qwen writes the header's "\n" + the content's "\n" as one token ("\n\n", 271);
        # Phi-3's <|user|> absorbs the content's leading whitespace and no "▁" is prepended after it.
        [("user", "\nHello"), ("assistant", "\n\n Hi \n")],
        [("user", " \t\r\nQuestion 1?"), ("assistant", "")],
    ]
    src = tmp_path / "chats.jsonl"
    src.write_text("".join(json.dumps({"messages": [{"role": r, "content": c} for r, c in chat]}) + "\n"
                           for chat in chats))
    report = check_template(str(src), RunConfig(tokenizer=str(tokenizer), template="hf"))
    assert (report.examples, report.identical) == (4, 4), report.first_diff


def test_check_template_counts_an_unreadable_input_and_goes_on(tiny: Path, tmp_path: Path, capsys) -> None:
    import gzip

    raw = tmp_path / "raw"
    raw.mkdir()
    shutil.copy(ASSETS / "chats.jsonl", raw / "a.jsonl")
    lines = [json.dumps({"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "x"}]})
             for i in range(2000)]
    body = gzip.compress("\n".join(lines).encode())
    (raw / "cut.jsonl.gz").write_bytes(body[: len(body) // 2])  # a truncated archive
    assert main(["check-template", str(raw), "--tokenizer", str(tiny), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rejected"]["corrupt_file"] == 1
    assert report["examples"] == 3  # a.jsonl only: a damaged archive gives nothing, its intact prefix neither
