"""etl.ingest.discover: which files of SRC are input, and the names they are written under."""

from __future__ import annotations

from pathlib import Path

import pytest

from etl.ingest.discover import classify, discover


def _touch(path: Path, text: str = '{"a": 1}\n') -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_discover_skips_hidden_and_underscore_directories(tmp_path: Path) -> None:
    raw = tmp_path / "_raw"  # the root itself may be underscore-named
    _touch(raw / "a.jsonl")
    _touch(raw / "sub" / "b.jsonl")
    _touch(raw / ".ipynb_checkpoints" / "a.jsonl")
    _touch(raw / "_old" / "c.jsonl")
    _touch(raw / "sub" / ".hidden.jsonl")
    names = [s.name for s in discover(str(raw))]
    assert names == ["a.jsonl", str(Path("sub") / "b.jsonl")]
    names = [s.name for s in discover(str(raw / "**" / "*.jsonl"))]
    assert names == ["a.jsonl", str(Path("sub") / "b.jsonl")]


def test_discover_glob_names_match_directory_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _touch(tmp_path / "raw" / "a.jsonl")
    _touch(tmp_path / "raw" / "b.jsonl")
    _touch(tmp_path / "raw" / "d" / "c.json")
    by_dir = {s.name for s in discover("raw/")}
    assert by_dir == {"a.jsonl", "b.jsonl", str(Path("d") / "c.json")}
    assert {s.name for s in discover("raw/*.jsonl")} == {"a.jsonl", "b.jsonl"}
    assert {s.name for s in discover("raw/**/*.json")} == {str(Path("d") / "c.json")}
    assert {s.name for s in discover(str(tmp_path / "raw" / "*.jsonl"))} == {"a.jsonl", "b.jsonl"}
    assert classify(Path("x.jsonl.zst")) == ("jsonl", "zstd")
