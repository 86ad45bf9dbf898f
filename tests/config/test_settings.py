"""What `etl run` is asked for (`settings_from_args`): the flags written into the config document
at their keys and checked with it, once; a mixture's sources, each with the flags over its own
options; SRC and DST sorted; and the plan that resolves the template once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from etl.cli import build_parser
from etl.columns import DEFAULT_SYSTEM_TEXT
from etl.config.build import settings_from_args
from etl.config.run_config import RunConfig, RunSettings
from etl.errors import EtlError
from etl.pipeline.plan import load_plan


def settings(tmp_path: Path, doc: dict | None, *argv: str) -> RunSettings:
    """`etl run ARGV` with `doc` as its --config file (None: no file)."""
    extra: list[str] = []
    if doc is not None:
        (tmp_path / "cfg.json").write_text(json.dumps(doc))
        extra = ["--config", str(tmp_path / "cfg.json")]
    return settings_from_args(build_parser(only="run").parse_args(["run", *argv, *extra]))


MIX = {"seq_len": 512, "sources": [
    {"path": "a.jsonl", "truncation": "keep_prefix", "default_system": "A."},
    {"path": "b.jsonl", "name": "bee", "epochs": 2, "input": {"type": "sharegpt"}}]}


def test_a_flag_is_written_at_its_key_over_the_file(tmp_path: Path) -> None:
    got = settings(tmp_path, {"seq_len": 512, "truncation": "keep_prefix"}, "SRC", "DST", "--seq-len", "64")
    assert (got.dst, [s.path for s in got.sources], got.mixture) == ("DST", ["SRC"], None)
    assert (got.config.seq_len, got.config.truncation) == (64, "keep_prefix")
    assert got.sources[0].config is got.config  # a plain run's one source reads the run's config
    # a bare policy name in the file and a flag under the same section
    both = settings(tmp_path, {"truncation": "keep_prefix"}, "S", "D", "--pair-fit", "shared")
    assert (both.config.truncation, both.config.pair_fit) == ("keep_prefix", "shared")


def test_a_bad_flag_is_told_as_the_files_key(tmp_path: Path) -> None:
    with pytest.raises(EtlError) as flag:
        settings(tmp_path, None, "S", "D", "--seq-len", "1")
    with pytest.raises(EtlError) as file:
        settings(tmp_path, {"seq_len": 1}, "S", "D")
    assert str(flag.value) == str(file.value) and str(flag.value).startswith("config: seq_len ")


def test_the_flags_win_over_every_sources_options(tmp_path: Path) -> None:
    got = settings(tmp_path, MIX, "DST", "--truncation", "drop", "--no-default-system")
    assert got.dst == "DST" and [s.name for s in got.sources] == ["a", "bee"]
    assert [(s.config.truncation, s.config.default_system, s.config.seq_len) for s in got.sources] == [
        ("drop", None, 512), ("drop", None, 512)]
    assert [s.config.input_type for s in got.sources] == ["chat", "sharegpt"]
    assert [(s.epochs, s.domain) for s in got.sources] == [(None, "a"), (2, "bee")]
    plain = settings(tmp_path, MIX, "DST")
    assert [(s.config.truncation, s.config.default_system) for s in plain.sources] == [
        ("keep_prefix", "A."), ("drop_oldest_turns", DEFAULT_SYSTEM_TEXT)]


def test_text_defaults_follow_the_input_type_the_run_ends_with(tmp_path: Path) -> None:
    over_file = settings(tmp_path, {"seq_len": 16}, "S", "D", "--input-type", "text").config
    alone = settings(tmp_path, None, "S", "D", "--input-type", "text", "--seq-len", "16").config
    assert over_file == alone
    assert (alone.truncation, alone.default_system, alone.mask.train_roles) == ("right", None, ("text",))


def test_src_and_dst_are_sorted_with_the_settings(tmp_path: Path) -> None:
    with pytest.raises(EtlError, match="SRC is left out"):
        settings(tmp_path, MIX, "SRC", "DST")
    with pytest.raises(EtlError, match="needs SRC and DST"):
        settings(tmp_path, None, "SRC")


def test_the_plan_resolves_every_source_once(tmp_path: Path) -> None:
    plan, tokenizer = load_plan(settings(tmp_path, MIX, "DST"))
    assert tokenizer is None  # a preset (ngpt for `bytes`): the engine loads the tokenizer
    assert [s.config.template for s in plan.sources] == ["ngpt", "ngpt"] and plan.config.template == "ngpt"
    assert [s.config.default_system for s in plan.sources] == ["A.", DEFAULT_SYSTEM_TEXT]
    body = plan.config_json()
    assert [s["config"]["template"] for s in body["mixture"]["sources"]] == ["ngpt", "ngpt"]
    assert body["mixture"]["sources"][1]["epochs"] == 2 and "mixture" not in plan.config.to_json()


def test_the_plan_refuses_mixed_kinds_before_the_tokenizer_loads(tmp_path: Path) -> None:
    doc = {"tokenizer": str(tmp_path / "missing"), "sources": [
        {"path": "a.jsonl"}, {"path": "b.jsonl", "input": {"type": "preference"}}]}
    with pytest.raises(EtlError, match="give preference and sft rows"):
        load_plan(settings(tmp_path, doc, "DST"))
    with pytest.raises(EtlError, match="applies to preference data"):
        load_plan(RunSettings.one("S", "D", RunConfig(truncation="keep_start")))
