"""Every flag a setting declares (`key(..., flag=...)`) is accepted by `etl run` and reaches its setting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from etl.cli import build_parser, main
from etl.config.build import flag_values
from etl.config.declare import MIB, choices, key_of, optional
from etl.config.run_config import RunConfig
from etl.output.manifest import read_manifest

ROOT = Path(__file__).resolve().parents[2]
DECLARED = {attr: k.flag for attr, info in RunConfig.model_fields.items() if (k := key_of(info)) and k.flag}


def sample(attr: str) -> tuple[str, Any]:
    """(the flag's text, the setting's value) for one valid, preferably non-default value."""
    info, k = RunConfig.model_fields[attr], key_of(RunConfig.model_fields[attr])
    if allowed := [v for v in choices(info.annotation) if v != info.default]:
        return str(allowed[-1]), allowed[-1]
    if k is not None and k.mib:
        return "2", 2 * MIB
    if optional(info.annotation)[0] is int:
        value = 1000 if info.default is None else info.default + 1  # None: the config's own (--max-pixels)
        return str(value), value
    if info.default is None:  # a free string whose default is null (--image-root)
        return "somewhere", "somewhere"
    return str(info.default), info.default  # a free string (tokenizer, template): its default parses


def test_the_declarations_declare_the_known_flags() -> None:
    """A guard that DECLARED is read from the declarations, not empty by a broken filter."""
    assert {"--seq-len", "--pair-fit", "--truncation", "--chunk-mb", "--input-type"} <= set(DECLARED.values())


@pytest.mark.parametrize("attr", sorted(DECLARED))
def test_every_declared_flag_parses_on_etl_run(attr: str) -> None:
    text, value = sample(attr)
    args = build_parser(only="run").parse_args(["run", "SRC", "DST", DECLARED[attr], text])
    assert flag_values(args)[attr] == value
    assert getattr(RunConfig(**flag_values(args)), attr) == value


def test_pair_fit_reaches_the_manifest(tmp_path: Path) -> None:
    out = tmp_path / "out"
    src = ROOT / "tests" / "assets" / "preference" / "pairs.jsonl"
    assert main(["run", str(src), str(out), "--input-type", "preference", "--pair-fit", "shared", "--quiet"]) == 0
    assert read_manifest(out)["config"]["pair_fit"] == "shared"
    assert json.loads((out / "_manifest.json").read_text())["counts"]["written"] > 0
