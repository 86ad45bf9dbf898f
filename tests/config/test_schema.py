"""One declaration per setting: the JSON Schema, the docs table (docs/config.md), the flags and the checks agree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import tomllib

from etl.cli import main
from etl.columns import INPUT_TYPES
from etl.config.build import config_from_dict
from etl.config.file import TURN_POLICIES
from etl.config.run_config import RunConfig
from etl.config.schema import markdown_table
from etl.errors import EtlError
from etl.formats.builders import BUILDERS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "configs"
CONFIGS = sorted(EXAMPLES.glob("*.json")) + sorted(EXAMPLES.glob("*.toml"))


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    """The schema as `etl config --schema` prints it."""
    proc = subprocess.run([sys.executable, "-m", "etl", "config", "--schema"], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    schema = json.loads(proc.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def load(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text()) if path.suffix == ".toml" else json.loads(path.read_text())


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_example_configs_match_the_schema(validator: jsonschema.Draft202012Validator, path: Path) -> None:
    doc = load(path)
    assert not [e.message for e in validator.iter_errors(doc)]
    config_from_dict(doc)  # and etl reads it


@pytest.mark.parametrize(
    "doc",
    [
        {"inptu": {}},
        {"preprocessing": {"dedupe": True}},
        {"input": {"type": "sharegpt", "message_key": "m"}},
        {"mask": {"bot": "train"}},
        {"truncation": "middle"},
        {"truncation": {"policy": "middle"}},
        {"mask_options": {"eot": "sometimes"}},
        {"output": {"storage_format": "csv"}},
        {"input": {"type": "xml"}},
        {"mask_default": "bogus"},
        {"version": 2},
        {"preprocessing": {"deduplicate": "false"}},
        {"split": {"val_fraction": 1.5}},
        {"seq_len": 1},
    ],
)
def test_bad_configs_fail_the_schema_and_etl(validator: jsonschema.Draft202012Validator, doc: dict[str, Any]) -> None:
    assert list(validator.iter_errors(doc))
    with pytest.raises(EtlError, match="^config: "):
        config_from_dict(doc)


def test_schema_key_is_accepted(validator: jsonschema.Draft202012Validator) -> None:
    doc = {"$schema": "../etl-config.schema.json", "seq_len": 64}
    assert not list(validator.iter_errors(doc))
    assert config_from_dict(doc)["seq_len"] == 64


def test_docs_hold_the_generated_table() -> None:
    table = markdown_table()
    assert table in (ROOT / "docs" / "config.md").read_text(encoding="utf-8"), (
        "docs/config.md's key table is stale: paste the output of `etl config` into it")


def test_config_command_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert out == markdown_table() and "| `truncation.policy` |" in out


def test_input_types_named_in_help_are_the_registered_builders() -> None:
    assert sorted(INPUT_TYPES) == sorted(BUILDERS)


def test_run_help_comes_from_the_declarations() -> None:
    code = ("import contextlib, io\nfrom etl.cli import main\nout = io.StringIO()\n"
            "with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n    main(['run', '--help'])\n"
            "print(out.getvalue())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    help_text = " ".join(proc.stdout.split())
    assert "{" + ",".join(TURN_POLICIES) + "}" in help_text
    assert f"default {RunConfig().seq_len}" in help_text


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"truncation": "middle"}, "config: truncation.policy is 'middle'; allowed: drop_oldest_turns"),
        ({"chunk_bytes": 0}, "config: chunk_bytes must be positive"),
        ({"val_fraction": True}, "config: split.val_fraction must be a number, got True"),
        ({"storage_format": "csv"}, "config: output.storage_format is 'csv'; allowed: bin, h5"),
        ({"max_tokens_per_shard": 0}, "config: output.max_tokens_per_shard must be a positive integer, got 0"),
    ],
)
def test_run_config_is_checked_by_the_same_declarations(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(EtlError) as info:
        RunConfig(**kwargs)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
