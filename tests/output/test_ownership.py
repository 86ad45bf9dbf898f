"""etl deletes only what it wrote, refuses folders that are not its own, and one writer at a time.

Each test is built from a repro of issue 8 (an adversarial user's session).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from etl.cli import main
from etl.output.manifest import read_manifest
from tests.commands.test_run_cli import EXAMPLES, ROOT, chat, etl, write_jsonl


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root (hidden ones too) and its sha256."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def data_files(root: Path) -> dict[str, str]:
    return {k: v for k, v in snapshot(root).items() if k.startswith(("data/", "turns/", "_rejects/"))}


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("clean") / "out"
    assert main(["run", str(EXAMPLES), str(dst), "--quiet"]) == 0
    return dst


SMALL_CHUNKS = ["--chunk-mb", "0.001"]  # many chunks: a run long enough to interrupt


@pytest.fixture(scope="module")
def clean_small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("clean_small") / "out"
    assert main(["run", str(EXAMPLES), str(dst), "--quiet", *SMALL_CHUNKS]) == 0
    return dst


USER_FILES = {
    "data/important.csv": "a,b\n",
    "turns/keep/x.txt": "mine",
    "_val/v.txt": "mine",
    "_rejects/r.txt": "mine",
    "reports/meta.json": json.dumps({"format_version": 3, "mine": True}),
    "notes.txt": "mine",
}


def plant(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_a_folder_that_is_not_etl_output_is_refused_and_untouched(tmp_path: Path) -> None:
    dst = tmp_path / "d"
    plant(dst, USER_FILES)
    before = snapshot(dst)
    r = etl("run", str(EXAMPLES), str(dst))
    assert r.returncode == 2 and "is not an etl output" in r.stderr and str(dst) in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert snapshot(dst) == before


def test_a_rerun_removes_exactly_what_the_manifest_lists(tmp_path: Path, clean: Path) -> None:
    dst = tmp_path / "out"
    assert main(["run", str(EXAMPLES), str(dst), "--quiet"]) == 0
    plant(dst, USER_FILES)  # the user adds files to an etl output
    stray = dst / "data" / "train" / "old-copy.parquet"
    stray.write_bytes((dst / "data" / "train" / "part-00000.parquet").read_bytes())
    one = write_jsonl(tmp_path / "one.jsonl", [chat(("user", "a"), ("assistant", "b"))])
    assert main(["run", str(one), str(dst), "--quiet"]) == 0
    after = snapshot(dst)
    assert all(after[rel] == hashlib.sha256(text.encode()).hexdigest() for rel, text in USER_FILES.items())
    assert "data/train/old-copy.parquet" in after  # not etl's: kept (and ignored by readers)
    listed = {f["path"] for f in read_manifest(dst)["files"]}
    parts = {k for k in after if k.startswith(("data/", "turns/", "_rejects/")) and k.endswith(".parquet")}
    assert parts - listed == {"data/train/old-copy.parquet"}
    assert read_manifest(dst)["counts"]["written"] == 1
    # Listed files carry what readers check.
    entry = next(f for f in read_manifest(dst)["files"] if f["path"] == "data/train/part-00000.parquet")
    part = dst / entry["path"]
    assert entry["bytes"] == part.stat().st_size and entry["rows"] == 1
    assert entry["sha256"] == hashlib.sha256(part.read_bytes()).hexdigest()


def test_a_file_in_the_way_of_a_part_is_never_overwritten(tmp_path: Path) -> None:
    dst = tmp_path / "out"
    assert main(["run", str(EXAMPLES), str(dst), "--quiet"]) == 0
    mine = dst / "_rejects" / "part-00003.parquet"  # where a bigger rerun would write
    mine.write_text("the user's")
    r = etl("run", str(EXAMPLES), str(dst), "--chunk-mb", "0.0001")
    assert r.returncode == 2 and "was not written by etl" in r.stderr and "part-00003" in r.stderr
    assert mine.read_text() == "the user's"
    assert not (dst / "_manifest.json").exists()  # the failed run never looks finished
    (mine).unlink()
    assert main(["run", str(EXAMPLES), str(dst), "--quiet"]) == 0  # the next run cleans up


def test_dst_equal_to_src_is_refused_and_nothing_is_deleted(tmp_path: Path) -> None:
    p = tmp_path / "p"
    write_jsonl(p / "data" / "chats.jsonl", [chat(("user", "a"), ("assistant", "b"))])
    write_jsonl(p / "other.jsonl", [chat(("user", "c"), ("assistant", "d"))])
    before = snapshot(p)
    for src in (p, p / "other.jsonl", p / "*.jsonl"):
        r = etl("run", str(src), str(p))
        assert r.returncode == 2 and "input" in r.stderr, r.stderr
        assert snapshot(p) == before


def test_input_under_a_folder_etl_writes_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["run", str(EXAMPLES), str(out), "--quiet"]) == 0
    write_jsonl(out / "data" / "new" / "x.jsonl", [chat(("user", "a"), ("assistant", "b"))])
    before = snapshot(out)
    r = etl("run", str(out / "data" / "new"), str(out))
    assert r.returncode == 2 and "a folder etl writes" in r.stderr
    assert snapshot(out) == before


def test_output_inside_the_input_folder_is_skipped_as_input(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    write_jsonl(raw / "a.jsonl", [chat(("user", "a"), ("assistant", "b"))])
    for _ in range(2):
        assert main(["run", str(raw), str(raw / "out"), "--quiet"]) == 0
        assert read_manifest(raw / "out")["counts"]["read"] == 1


HELD_RUN = """
import os, sys, time
import etl.pipeline.chunk
real = etl.pipeline.chunk.process_chunk
go = sys.argv.pop(1)
def held(*args, **kwargs):  # mid-run (a part written, the lock held) until the test says go
    while not os.path.exists(go):
        time.sleep(0.01)
    return real(*args, **kwargs)
etl.pipeline.chunk.process_chunk = held
from etl.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_second_writer_is_refused_and_the_first_finishes_clean(tmp_path: Path, clean_small: Path) -> None:
    dst, go = tmp_path / "out", tmp_path / "go"
    first = subprocess.Popen(
        [sys.executable, "-c", HELD_RUN, str(go), "run", str(EXAMPLES), str(dst), "--quiet", *SMALL_CHUNKS],
        cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 60
    while not (dst / "_journal.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    second = etl("run", str(EXAMPLES), str(dst), "--quiet")
    go.touch()
    assert first.wait(timeout=120) == 0, first.stderr.read() if first.stderr else ""
    assert second.returncode == 2
    assert "is being written by pid" in second.stderr and str(first.pid) in second.stderr
    assert data_files(dst) == data_files(clean_small)
    assert not (dst / "_lock").exists() and not (dst / "_journal.jsonl").exists()


KILLED_RUN = """
import os, signal, sys
import etl.pipeline.chunk
real = etl.pipeline.chunk.process_chunk
calls = []
def die(*args, **kwargs):
    calls.append(1)
    if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kwargs)
etl.pipeline.chunk.process_chunk = die
from etl.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_killed_writer_leaves_a_lock_the_next_run_takes_over(tmp_path: Path, clean: Path) -> None:
    dst = tmp_path / "out"
    assert main(["run", str(EXAMPLES), str(dst), "--quiet"]) == 0
    plant(dst, {"notes.txt": "mine"})  # an etl output with a user's file in it
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_RUN, "run", str(EXAMPLES), str(dst), "--quiet", *SMALL_CHUNKS],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert killed.returncode == -signal.SIGKILL
    assert (dst / "_lock").exists() and (dst / "_journal.jsonl").exists()
    assert not (dst / "_manifest.json").exists()  # it never looks finished
    r = etl("run", str(EXAMPLES), str(dst), "--quiet")
    assert r.returncode == 0 and "interrupted etl writer" in r.stderr
    assert data_files(dst) == data_files(clean)
    assert (dst / "notes.txt").read_text() == "mine"
    assert sorted(os.listdir(dst)) == ["README.md", "_manifest.json", "_rejects", "data", "notes.txt", "turns"]


def test_a_manifest_cannot_make_a_rerun_delete_outside_dst(tmp_path: Path) -> None:
    dst = tmp_path / "out"
    assert main(["run", str(EXAMPLES), str(dst), "--quiet"]) == 0
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    manifest = json.loads((dst / "_manifest.json").read_text())
    manifest["files"].append({"path": "../victim.txt", "rows": None, "bytes": 4, "sha256": ""})
    manifest["files"].append({"path": str(victim), "rows": None, "bytes": 4, "sha256": ""})
    (dst / "_manifest.json").write_text(json.dumps(manifest))
    assert main(["run", str(EXAMPLES), str(dst), "--quiet"]) == 0
    assert victim.read_text() == "keep"


def test_export_claims_out_like_run_claims_dst(tmp_path: Path, clean: Path) -> None:
    out = tmp_path / "episodes"
    plant(out, {"train/tokens.bin": "not etl's"})
    r = etl("export", str(clean), str(out), "--format", "episodes")
    assert r.returncode == 2 and "is not an etl output" in r.stderr
    assert (out / "train" / "tokens.bin").read_text() == "not etl's"
    fresh = tmp_path / "fresh"
    assert main(["export", str(clean), str(fresh), "--format", "episodes"]) == 0
    plant(fresh, {"train/mine.txt": "mine"})
    assert main(["export", str(clean), str(fresh), "--format", "bin"]) == 0  # replaces the episodes
    assert sorted(p.name for p in (fresh / "train").iterdir()) == ["mine.txt"]
    record = json.loads((fresh / "_export.json").read_text())
    assert record["format"] == "bin" and all(not f["path"].startswith("train/") for f in record["files"])


def test_a_run_killed_while_removing_the_old_output_is_recovered(tmp_path: Path, clean: Path, monkeypatch) -> None:
    import etl.output.writer

    dst = tmp_path / "out"
    assert main(["run", str(EXAMPLES), str(dst), "--quiet", *SMALL_CHUNKS]) == 0
    real, calls = etl.output.writer._prune_empty, []

    def killed(path: Path, root: Path) -> None:  # the process dies after a few deletions
        calls.append(path)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real(path, root)

    monkeypatch.setattr(etl.output.writer, "_prune_empty", killed)
    assert main(["run", str(EXAMPLES), str(dst), "--quiet"]) == 130
    monkeypatch.setattr(etl.output.writer, "_prune_empty", real)
    assert not (dst / "_manifest.json").exists() and (dst / "_journal.jsonl").exists()
    assert main(["run", str(EXAMPLES), str(dst), "--quiet"]) == 0  # still etl's: taken over
    assert data_files(dst) == data_files(clean)


def test_a_full_disk_says_so_and_where(tmp_path: Path, monkeypatch, capsys) -> None:
    import etl.output.parquet

    def full(table: object, where: object, **kwargs: object) -> None:  # as pyarrow reports it
        raise OSError("Error writing bytes to file. Detail: [errno 28] No space left on device")

    monkeypatch.setattr(etl.output.parquet.pq, "write_table", full)
    dst = tmp_path / "out"
    assert main(["run", str(EXAMPLES), str(dst), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "no space left on device while writing" in err and str(dst) in err
    assert "internal error" not in err and len(err.strip().splitlines()) == 1
