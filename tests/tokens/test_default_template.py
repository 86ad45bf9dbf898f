"""Defaults that fit the tokenizer: `template: auto` and the template's own default system prompt.

`auto` is `hf` for a tokenizer with a chat_template (and without ngpt's markers), else `ngpt`; a
conversation without a system message gets the template's own unless `default_system` is given.
Offline: the byte tokenizer, and the tiny byte-level tokenizer over `tests/assets/tiny_chat`'s
tokenizer_config.json (chat_template with a bos, "You are tiny." as its default system prompt,
`<|role|>...<|end|>\\n` turns and an eos), with and without ngpt's markers and its chat_template.
The Qwen2.5 / Qwen3 checks against transformers are in test_default_template_real.py.
"""

from __future__ import annotations

import argparse
import json
import pickle
import shutil
from pathlib import Path

import pytest

from etl.analysis.check_template import check_template
from etl.cli import main
from etl.columns import DEFAULT_SYSTEM_TEXT
from etl.config.build import config_from_args
from etl.config.run_config import RunConfig, RunSettings
from etl.engine.ray_run import for_workers
from etl.errors import EtlError
from etl.pipeline.plan import plan_with
from etl.pipeline.resources import build_resources
from etl.pipeline.startup import preset_template
from etl.tokens.hf_template import load_template_and_tokenizer
from etl.tokens.loading import has_chat_template
from etl.tokens.templates import NGPT_MARKERS, preset
from tests.commands.test_rough_edges import write_tiny_tokenizer

CHATS = [
    {"messages": [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello"}]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"},
                  {"role": "assistant", "content": "6"}]},
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_tokenizer(tmp_path_factory.mktemp("auto") / "tiny")


@pytest.fixture(scope="module")
def marked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny tokenizer with ngpt's four markers added: trained with etl's own format."""
    return write_tiny_tokenizer(tmp_path_factory.mktemp("auto") / "marked", extra=NGPT_MARKERS)


@pytest.fixture(scope="module")
def bare(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny tokenizer without a chat_template in its tokenizer_config.json."""
    out = tmp_path_factory.mktemp("auto") / "bare"
    shutil.copytree(tiny, out)
    config = json.loads((out / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def resolved(**given: object) -> RunConfig:
    return build_resources(RunConfig(**given)).config  # type: ignore[arg-type]


def test_auto_is_ngpt_for_bytes_and_the_default_run_records_it() -> None:
    assert RunConfig().template == "auto" and "template" not in RunConfig().model_fields_set
    assert preset_template(RunConfig()).name == "ngpt"  # known before the tokenizer loads
    config = resolved()
    assert (config.template, config.default_system) == ("ngpt", DEFAULT_SYSTEM_TEXT)
    assert config.to_json()["template"] == "ngpt"


def test_auto_is_hf_for_a_chat_template_with_its_own_system_prompt(tiny: Path) -> None:
    assert has_chat_template(tiny) and has_chat_template(tiny / "tokenizer.json")
    assert preset_template(RunConfig(tokenizer=str(tiny))) is None  # hf: the tokenizer decides
    template, _ = load_template_and_tokenizer("auto", tokenizer_spec=str(tiny))
    assert template.name == "hf"
    for given in ({}, {"template": "hf"}):  # explicit hf takes the template's own prompt too
        config = resolved(tokenizer=str(tiny), **given)
        assert (config.template, config.default_system) == ("hf", "You are tiny.")


def test_ngpt_markers_win_over_a_chat_template(marked: Path) -> None:
    config = resolved(tokenizer=str(marked))
    assert (config.template, config.default_system) == ("ngpt", DEFAULT_SYSTEM_TEXT)


def test_auto_decides_without_parsing_tokenizer_json_where_no_marker_is_in_it(tiny: Path, marked: Path,
                                                                              tmp_path: Path) -> None:
    """The run then parses it beside the first chunk's parse; where every marker's string is somewhere
    in the file (here inside other added tokens) the parsed tokenizer answers."""
    template, tok = load_template_and_tokenizer("auto", tokenizer_spec=str(tiny), lazy=True)
    assert template.name == "hf" and "_tok" not in vars(tok)  # not parsed
    template, tok = load_template_and_tokenizer("auto", tokenizer_spec=str(marked), lazy=True)
    assert template.name == "ngpt" and "_tok" in vars(tok)
    near = write_tiny_tokenizer(tmp_path / "near", extra=[m + "x" for m in NGPT_MARKERS])
    assert has_chat_template(near)
    template, tok = load_template_and_tokenizer("auto", tokenizer_spec=str(near), lazy=True)
    assert template.name == "hf" and "_tok" in vars(tok) and tok.special_id(NGPT_MARKERS[0]) is None


def test_a_tokenizer_json_alone_or_without_chat_template_is_ngpt(tiny: Path, bare: Path, tmp_path: Path) -> None:
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(tiny / "tokenizer.json", alone)
    for spec in (alone / "tokenizer.json", bare):
        assert not has_chat_template(spec) and preset_template(RunConfig(tokenizer=str(spec))).name == "ngpt"
    with pytest.raises(EtlError) as err:  # no markers either: the error names the way out
        resolved(tokenizer=str(bare))
    message = str(err.value)
    assert "template ngpt" in message and "no chat_template" in message
    assert "--template chatml|llama3|phi3|post_training, or hf" in message


def args(**flags: object) -> argparse.Namespace:
    base = {"config": None, "tokenizer": None, "template": None, "no_default_system": False}
    return argparse.Namespace(**{**base, **flags})


@pytest.mark.parametrize(("doc", "flags", "expected"), [
    ({"default_system": "Be kind."}, {}, "Be kind."),
    ({"default_system": None}, {}, None),
    ({"default_system": DEFAULT_SYSTEM_TEXT}, {}, DEFAULT_SYSTEM_TEXT),  # given: kept, even the preset text
    ({}, {"no_default_system": True}, None),
    ({"template": None}, {}, "You are tiny."),  # null: the default, auto
])
def test_a_given_default_system_overrides_the_templates(tiny: Path, tmp_path: Path, doc: dict[str, object],
                                                         flags: dict[str, object], expected: str | None) -> None:
    (tmp_path / "cfg.json").write_text(json.dumps(doc))
    config = config_from_args(args(config=str(tmp_path / "cfg.json"), tokenizer=str(tiny), **flags))
    res = build_resources(config)
    assert (res.config.template, res.config.default_system) == ("hf", expected)
    assert res.system_ids == (None if expected is None else res.tokenizer.encode_fixed(expected))


def test_replace_keeps_what_was_given_and_resolving_twice_changes_nothing(tiny: Path) -> None:
    config = RunConfig(tokenizer=str(tiny), seq_len=64)
    assert config.replace(seq_len=32).model_fields_set == {"tokenizer", "seq_len"}
    plan = build_resources(config).plan
    once = plan.config
    assert once.template == "hf" and once.default_system == "You are tiny."
    # Resolved again, with another template: what the first resolution gave counts as given.
    again = plan_with(RunSettings.one("", "", once), preset("ngpt"), plan.kind)
    assert again.config.template == "ngpt" and again.config.default_system == "You are tiny."
    assert build_resources(once).config == once
    # Ray's workers get the driver's plan (its template too), through pickle, with what was given.
    shipped = pickle.loads(pickle.dumps(plan.with_changes(**for_workers(once).model_dump(include={"tokenizer"}))))
    assert shipped.config == once and "default_system" in shipped.config.model_fields_set
    assert shipped.template == plan.template and shipped.sources[0].config == once


def test_the_run_writes_the_templates_ids_and_records_its_choices(tiny: Path, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    src = tmp_path / "chats.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in CHATS))
    assert main(["run", str(src), str(tmp_path / "out"), "--tokenizer", str(tiny), "--quiet"]) == 0
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["config"]["template"] == "hf" and manifest["template"]["name"] == "hf"
    assert manifest["config"]["default_system"] == "You are tiny."
    card = (tmp_path / "out" / "README.md").read_text()
    assert "template `hf` (the tokenizer's own chat_template), default system prompt \"You are tiny.\"" in card
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "out" / "data").to_pylist()
    reference = transformers.AutoTokenizer.from_pretrained(tiny)
    assistant, end = reference.convert_tokens_to_ids("<|assistant|>"), reference.convert_tokens_to_ids("<|end|>")
    for row, record in zip(rows, CHATS, strict=True):
        ids = list(reference.apply_chat_template(record["messages"], tokenize=True)["input_ids"])
        assert row["input_ids"] == ids
        # Trained: each assistant turn's content and its <|end|>, nothing else.
        trained, inside = [], False
        for token in ids:
            trained.append(inside)
            inside = token == assistant or (inside and token != end)
        assert [bool(m) for m in row["loss_mask"]] == trained


def test_a_mixtures_sources_record_the_resolved_config(tiny: Path, tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CHATS))
    mix = {"tokenizer": str(tiny), "sources": [{"path": str(tmp_path / "a.jsonl")},
                                               {"path": str(tmp_path / "b.jsonl"), "default_system": "B."}]}
    (tmp_path / "mix.json").write_text(json.dumps(mix))
    assert main(["run", "--config", str(tmp_path / "mix.json"), str(tmp_path / "out"), "--quiet"]) == 0
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    sources = manifest["config"]["mixture"]["sources"]
    assert [(s["config"]["template"], s["config"]["default_system"]) for s in sources] == [
        ("hf", "You are tiny."), ("hf", "B.")]


def test_check_template_takes_the_configs_template(marked: Path, tmp_path: Path) -> None:
    src = tmp_path / "chats.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in CHATS))
    by_default = check_template(str(src), RunConfig(tokenizer=str(marked)))
    assert (by_default.template, by_default.default_system) == ("ngpt", DEFAULT_SYSTEM_TEXT)
    (tmp_path / "cfg.json").write_text(json.dumps({"template": "hf"}))
    config = config_from_args(args(config=str(tmp_path / "cfg.json"), tokenizer=str(marked)))
    from_file = check_template(str(src), config)
    assert (from_file.template, from_file.default_system) == ("hf", "You are tiny.")
    assert from_file.identical == from_file.examples == len(CHATS)
