"""`make etl`'s variables become `etl run` flags (unset: no flag), and the install prints no error line."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from etl.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
STAMP = ".venv/.installed"  # held old (-o): a dry run never plans to rebuild the venv
VARIABLES = {"CONFIG": ("--config", "cfg.json"), "TOKENIZER": ("--tokenizer", "bytes"),
             "TEMPLATE": ("--template", "chatml"), "SEQ_LEN": ("--seq-len", "4096"),
             "INPUT_TYPE": ("--input-type", "sharegpt")}


def etl_line(*assignments: str) -> list[str]:
    """The `etl run` command `make etl` would run, as words (a dry run: nothing runs)."""
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    proc = subprocess.run(["make", "-n", "-o", STAMP, "etl", *assignments], cwd=REPO, capture_output=True,
                          text=True, check=True, timeout=30)
    line = next(line for line in proc.stdout.splitlines() if " run " in line)
    return shlex.split(line)


def test_unset_variables_pass_no_flag() -> None:
    assert etl_line("SRC=raw/", "DST=out/")[1:] == ["run", "raw/", "out/"]


@pytest.mark.parametrize("variable", sorted(VARIABLES))
def test_each_variable_passes_its_flag(variable: str) -> None:
    flag, value = VARIABLES[variable]
    words = etl_line(f"{variable}={value}")
    assert words[-2:] == [flag, value]
    args = build_parser(only="run").parse_args(words[1:])  # and `etl run` takes it
    assert vars(args)[flag.lstrip("-").replace("-", "_")] == (int(value) if variable == "SEQ_LEN" else value)


def test_no_recipe_line_ignores_its_errors() -> None:
    """A '-' recipe line that fails makes make print 'Error N (ignored)' on the normal path."""
    recipes = [line for line in (REPO / "Makefile").read_text().splitlines() if line.startswith("\t")]
    assert recipes and not [line for line in recipes if line.lstrip("\t").startswith("-")]
