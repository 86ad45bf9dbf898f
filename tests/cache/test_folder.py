"""The cache folder: least recently used segments go first when over the cap, stale temporary
files are swept, and `etl cache info|clear` report and empty it, touching only etl's own files."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from etl.cache import folder as fo
from etl.cache.segments import write_segment
from etl.cli import main
from tests.cache.common import all_files, chats, etl_run, segment_files, write_jsonl

LIST = pa.large_list(pa.int32())


def make_segment(space: Path, n: int, seed: int) -> Path:
    """A real segment of n texts (different seeds: different files)."""
    keys = np.array([[seed, i] for i in range(n)], np.uint64)
    return write_segment(space, keys, pa.array([[seed, i, i] for i in range(n)], LIST))


def aged(path: Path, seconds_ago: float) -> Path:
    t = time.time() - seconds_ago
    os.utime(path, (t, t))
    return path


def test_evict_removes_least_recently_used_first(tmp_path: Path) -> None:
    """Three segments used 300, 200 and 100 s ago: a cap that fits the two newest removes the
    oldest only; a cap that fits one removes the next oldest; a big cap removes nothing; cap 0 all."""
    root = fo.open_root(tmp_path / "cache")
    space = fo.namespace(root, '{"k": 1}')
    old, mid, new = make_segment(space, 30, 1), make_segment(space, 20, 2), make_segment(space, 10, 3)
    aged(old, 300), aged(mid, 200), aged(new, 100)
    size = {p: p.stat().st_size for p in (old, mid, new)}

    assert fo.evict(root, 10**9) == (0, 0)
    assert fo.evict(root, size[mid] + size[new]) == (1, size[old])
    assert segment_files(root) == sorted([mid, new])
    assert fo.evict(root, size[new] + size[mid] - 1) == (1, size[mid])
    assert segment_files(root) == [new]
    assert fo.evict(root, 0) == (1, size[new])
    assert segment_files(root) == []
    assert (space / "key.json").is_file() and (root / fo.MARKER).is_file()


def test_evict_goes_by_use_not_by_name_or_creation(tmp_path: Path) -> None:
    """Eviction order is mtime (last use), over namespaces: the newest-made but least-used goes first."""
    root = fo.open_root(tmp_path / "cache")
    a = make_segment(fo.namespace(root, "a"), 10, 1)
    b = make_segment(fo.namespace(root, "b"), 10, 2)
    aged(b, 500), aged(a, 50)
    size_b = b.stat().st_size
    assert fo.evict(root, a.stat().st_size) == (1, size_b)
    assert a.exists() and not b.exists()


def test_evict_sweeps_stale_temporary_files_only(tmp_path: Path) -> None:
    """A `.tmp-*` file older than a day (a crashed writer's) is removed; a fresh one (a live writer's)
    and files etl does not name are kept."""
    root = fo.open_root(tmp_path / "cache")
    space = fo.namespace(root, "k")
    stale = space / ".tmp-123-abc.parquet"
    stale.write_bytes(b"x")
    aged(stale, 2 * 24 * 3600)
    live = space / ".tmp-456-def.parquet"
    live.write_bytes(b"y")
    foreign = space / "notes.txt"
    foreign.write_text("mine")
    aged(foreign, 10 * 24 * 3600)
    fo.evict(root, 0)
    assert not stale.exists() and live.exists() and foreign.exists()


@pytest.fixture
def filled(tmp_path: Path, tiny_tokenizer_path: Path) -> Path:
    """A cache filled by a cold and a warm `etl run` of 20 chats; its root."""
    src = write_jsonl(tmp_path / "src" / "chats.jsonl", chats(20)).parent
    cache = tmp_path / "cache"
    flags = ["--tokenizer", str(tiny_tokenizer_path), "--template", "chatml", "--cache", str(cache)]
    etl_run(src, tmp_path / "cold", *flags)
    etl_run(src, tmp_path / "warm", *flags, "--seq-len", "64")
    return cache


def test_info_json(filled: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`etl cache info --format json`: bytes = the segments' and parsed chunks' sizes on disk, their counts, the hit rate
    over the logged runs (cold 0 of D, warm D of D: 0.5), the last runs, the cap in force."""
    monkeypatch.setenv("ETL_CACHE_MAX_GB", "2")
    assert main(["cache", "info", "--cache", str(filled), "--format", "json"]) == 0
    about = json.loads(capsys.readouterr().out)
    segs = segment_files(filled)
    assert len(segs) == 1
    assert about["dir"] == str(filled) and about["exists"] is True
    (parsed,) = fo.parsed_files(filled)  # one chunk, parsed by the cold run, read by the warm one
    assert about["parsed_chunks"] == {"files": 1, "bytes": parsed.stat().st_size}
    assert about["bytes"] == sum(p.stat().st_size for p in segs) + parsed.stat().st_size
    assert about["max_bytes"] == 2 * 10**9
    (space,) = about["namespaces"]
    assert space["segments"] == 1 and space["bytes"] == segs[0].stat().st_size
    assert space["namespace"] == segs[0].parent.name
    assert about["runs_logged"] == 2 and about["hit_rate"] == 0.5
    cold, warm = about["last_runs"]
    distinct = 1 + 7 + 20  # the system prompt, 7 user turns, 20 assistant turns
    assert (cold["distinct"], cold["from_cache"], cold["tokenized"], cold["hit_rate"]) == (distinct, 0, distinct, 0.0)
    assert (warm["distinct"], warm["from_cache"], warm["tokenized"], warm["hit_rate"]) == (distinct, distinct, 0, 1.0)
    assert cold["strings"] == warm["strings"] == 60

    assert main(["cache", "info", "--cache", str(filled), "--format", "json", "--runs", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["last_runs"] == [warm]


def test_info_table(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`etl cache info` (table): the folder, segment count, hit rate and one line per run."""
    assert main(["cache", "info", "--cache", str(filled)]) == 0
    out = capsys.readouterr().out
    assert str(filled) in out and "1 segments" in out and "parsed input chunks: 1," in out
    assert "hit rate over 2 logged runs: 50.0% of distinct texts" in out
    assert "60 texts, 28 distinct, 0 from the cache (0.0%), 28 tokenized" in out
    assert "28 from the cache (100.0%), 0 tokenized" in out


def test_info_uses_etl_cache_dir(isolated_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --cache, info reads $ETL_CACHE_DIR; a folder no run filled reads as empty."""
    assert main(["cache", "info"]) == 0
    assert f"token cache {isolated_cache}: empty" in capsys.readouterr().out
    assert main(["cache", "info", "--format", "json"]) == 0
    about = json.loads(capsys.readouterr().out)
    assert (about["dir"], about["exists"], about["bytes"], about["hit_rate"], about["last_runs"]) == (
        str(isolated_cache), False, 0, None, [])
    assert not isolated_cache.exists()


def test_clear_removes_only_etls_files(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`etl cache clear`: segments, key and answers files, parsed chunks and the run log go; a file the user put in the root
    (and one in a namespace folder) stays, and so does the marker. Info then shows 0 bytes."""
    (filled / "README-mine.txt").write_text("keep me")
    (seg,) = segment_files(filled)
    space = seg.parent
    (space / "my-notes.txt").write_text("keep me too")
    other = fo.namespace(filled, "another tokenizer")
    make_segment(other, 5, 9)
    removed_bytes = sum(p.stat().st_size for p in segment_files(filled)) + sum(
        (d / "key.json").stat().st_size for d in (space, other)) + (space / "answers.json").stat().st_size
    (parsed,) = fo.parsed_files(filled)  # the runs' one chunk
    removed_bytes += parsed.stat().st_size

    assert main(["cache", "clear", "--cache", str(filled)]) == 0
    out = capsys.readouterr().out
    assert "removed 6 files" in out and str(filled) in out
    assert f"({removed_bytes / 1e6:,.1f} MB)" in out
    left = sorted(str(p.relative_to(filled)) for p in filled.rglob("*") if p.is_file())
    assert left == sorted(["ETL_TOKEN_CACHE", "README-mine.txt", f"{space.name}/my-notes.txt"])
    assert (filled / "README-mine.txt").read_text() == "keep me"
    assert not other.exists()  # emptied namespace folders go

    assert main(["cache", "info", "--cache", str(filled), "--format", "json"]) == 0
    about = json.loads(capsys.readouterr().out)
    assert about["bytes"] == 0 and about["runs_logged"] == 0 and about["hit_rate"] is None


def test_clear_refuses_a_folder_that_is_not_a_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """clear on a folder without ETL_TOKEN_CACHE (even one shaped like a cache): exit 2, an error
    naming the folder and the marker, and not a file removed."""
    folder = tmp_path / "looks-like-a-cache"
    space = folder / ("a" * 32)
    space.mkdir(parents=True)
    (space / "key.json").write_text("{}")
    make_segment(space, 3, 1)
    (folder / "runs.jsonl").write_text("{}\n")
    before = all_files(folder)
    assert main(["cache", "clear", "--cache", str(folder)]) == 2
    err = capsys.readouterr().err
    assert str(folder) in err and "ETL_TOKEN_CACHE" in err and "nothing removed" in err
    assert all_files(folder) == before


def test_clear_of_a_missing_folder_does_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """clear on a folder that does not exist: success, 0 files, and the folder is not made."""
    assert main(["cache", "clear", "--cache", str(tmp_path / "nope")]) == 0
    assert "removed 0 files" in capsys.readouterr().out
    assert not (tmp_path / "nope").exists()


def test_open_root_accepts_new_or_empty_folders_only(tmp_path: Path) -> None:
    """open_root makes a missing folder (with its marker), adopts an empty one, reopens a cache, and
    refuses a file or a non-empty foreign folder (EtlError naming it) without writing to it."""
    from etl.errors import EtlError

    made = fo.open_root(tmp_path / "a" / "b")
    assert fo.is_cache(made)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert fo.is_cache(fo.open_root(empty)) and fo.open_root(made) == made
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "x").write_text("x")
    with pytest.raises(EtlError, match=str(foreign)):
        fo.open_root(foreign)
    assert [p.name for p in foreign.iterdir()] == ["x"]
    with pytest.raises(EtlError, match="is a file"):
        fo.open_root(foreign / "x")


def test_settings_resolve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_cache: Path) -> None:
    """--cache beats $ETL_CACHE_DIR; --no-cache means no root; the cap is the flag's, else the
    environment's, else 4 GB, in bytes."""
    assert fo.CacheSettings.resolve() == fo.CacheSettings(isolated_cache, 4 * 10**9)
    assert fo.CacheSettings.resolve(str(tmp_path / "x")).root == tmp_path / "x"
    assert fo.CacheSettings.resolve(str(tmp_path / "x"), disabled=True).root is None
    assert fo.CacheSettings.resolve(max_gb=0.5).max_bytes == 5 * 10**8
    monkeypatch.setenv("ETL_CACHE_MAX_GB", "1.5")
    assert fo.CacheSettings.resolve().max_bytes == 15 * 10**8
    assert fo.CacheSettings.resolve(max_gb=0).max_bytes == 0


def test_run_log_keeps_the_last_runs_and_skips_cut_lines(tmp_path: Path) -> None:
    """runs.jsonl: a line a crash cut short is skipped; once past 400 kB the log is cut to its last
    1,000 runs, so it stays under ~400 kB and holds the newest runs, in order."""
    root = fo.open_root(tmp_path / "cache")
    fo.log_run(root, {"n": 0})
    with (root / fo.RUNS_LOG).open("a") as f:
        f.write('{"n": "cut')  # no newline: the next line starts after it, on the same line
    (root / fo.RUNS_LOG).write_text((root / fo.RUNS_LOG).read_text() + "\n")
    fo.log_run(root, {"n": 1})
    assert fo.runs(root) == [{"n": 0}, {"n": 1}]
    pad = "p" * 300
    for i in range(2, 1500):
        fo.log_run(root, {"n": i, "pad": pad})
    logged = fo.runs(root)
    line = len(json.dumps({"n": 1499, "pad": pad}, sort_keys=True)) + 1
    assert (root / fo.RUNS_LOG).stat().st_size <= fo.LOG_KEEP * 400 + line
    assert fo.LOG_KEEP <= len(logged) < 1500 and logged[-1]["n"] == 1499
    assert [r["n"] for r in logged] == list(range(1500 - len(logged), 1500))
    assert not list(root.glob(".tmp-*"))
