"""`etl --help` and every `etl CMD --help` start light: none imports DuckDB, pyarrow, Polars, numpy
or torch (the heavy modules are imported where a command runs, not where its parser is built).

Each help runs in a fresh interpreter, as `python -m etl CMD --help` does, which then prints the
heavy modules it holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from etl.cli import _command_modules

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("duckdb", "pyarrow", "polars", "numpy", "torch")
# etl run's and etl check-template's flags come from RunConfig's declarations (etl.config.build.add_flags),
# so their help imports pydantic; the other commands' helps do not.
PYDANTIC_HELPS = {"run", "check-template"}
COMMANDS = sorted(m.NAME for m in _command_modules())


def help_modules(*argv: str) -> tuple[str, list[str]]:
    """The help text of `etl ARGV --help`, and the HEAVY modules (pydantic too) imported to print it."""
    code = (
        "import json, sys\n"
        "from etl.cli import main\n"
        "try:\n"
        f"    main({[*argv, '--help']!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(json.dumps(sorted(m for m in {[*HEAVY, 'pydantic']!r} if m in sys.modules)))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                          check=True, timeout=120)
    text, _, last = done.stdout.rstrip("\n").rpartition("\n")
    return text, json.loads(last)


def test_every_command_is_checked() -> None:
    assert {"run", "stats", "report", "inspect", "export", "pack", "cache", "check-template", "config"} <= set(COMMANDS)


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_imports_no_heavy_module(command: str) -> None:
    text, imported = help_modules(*filter(None, [command]))
    assert text.startswith(f"usage: etl {command}".rstrip())
    allowed = {"pydantic"} if command in PYDANTIC_HELPS else set()
    assert set(imported) <= allowed, f"`etl {command} --help` imports {imported}"
