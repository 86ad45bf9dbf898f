"""Fixtures of the stats tests: hand-made DST folders (see stats_fixtures.py) and real output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stats_fixtures import COUNTS, EXAMPLES, REJECTS, REPO, etl_cli, write_dst


@pytest.fixture(scope="session")
def dst(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The main fixture: 6 train + 2 val examples over 3 part files, 3 rejects."""
    return write_dst(tmp_path_factory.mktemp("dst"), EXAMPLES, counts=COUNTS, rejects=REJECTS)


@pytest.fixture(scope="session")
def empty_dst(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run that wrote nothing: every row dropped, no data, turns or rejects files."""
    counts = {"read": 2, "written": 0, "truncated": 0, "dropped": {"too_long": 2}, "rejected": {}}
    return write_dst(tmp_path_factory.mktemp("empty"), [], counts=counts, rejects=None)


@pytest.fixture(scope="session")
def real_dst(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`etl run examples/raw` output; skipped while the pipeline command does not exist yet."""
    if not (REPO / "etl" / "commands" / "run.py").is_file() or not (REPO / "examples" / "raw").is_dir():
        pytest.skip("`etl run` is not available yet")
    out = tmp_path_factory.mktemp("real") / "dst"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "etl", "run", str(REPO / "examples" / "raw"), str(out), "--seq-len", "256"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture
def cli() -> Any:
    return etl_cli
