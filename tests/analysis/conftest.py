"""Fixtures of the stats tests: hand-made DST folders (see stats_fixtures.py) and real output."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.analysis.stats_fixtures import (
    COUNTS,
    EXAMPLES,
    REJECTS,
    REPO,
    etl_cli,
    write_dst,
    write_raw_chats,
)


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
    """Output of the real `etl run --seq-len 256` on generated chats (+ examples/raw when present).

    The generated input has long multi-turn chats (truncation), a bad JSON line and an empty
    conversation (rejects).
    """
    raw = tmp_path_factory.mktemp("raw")
    write_raw_chats(raw / "chats.jsonl")
    for sample in (REPO / "examples" / "raw").glob("*.*"):
        shutil.copy(sample, raw / sample.name)
    out = tmp_path_factory.mktemp("real") / "dst"
    proc = etl_cli("run", str(raw), str(out), "--seq-len", "256", "--quiet")
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(params=["dst", "real_dst"])
def any_dst(request: pytest.FixtureRequest) -> Path:
    """The hand-made fixture, then the real pipeline's output: for checks that hold on both."""
    return request.getfixturevalue(request.param)


@pytest.fixture
def cli() -> Any:
    return etl_cli


@pytest.fixture(scope="session")
def pref(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hand-made preference output (tests/analysis/pair_fixtures.py)."""
    from tests.analysis.pair_fixtures import PAIR_COUNTS, PAIRS, write_pair_dst
    from tests.analysis.pair_fixtures import REJECTS as PAIR_REJECTS

    return write_pair_dst(tmp_path_factory.mktemp("pref"), "preference", PAIRS, PAIR_COUNTS, PAIR_REJECTS)


@pytest.fixture(scope="session")
def kto(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hand-made unpaired (KTO) output."""
    from tests.analysis.pair_fixtures import (
        UNPAIRED,
        UNPAIRED_COUNTS,
        UNPAIRED_REJECTS,
        write_pair_dst,
    )

    return write_pair_dst(tmp_path_factory.mktemp("kto"), "unpaired", UNPAIRED, UNPAIRED_COUNTS, UNPAIRED_REJECTS)
