"""`etl pack` as a user runs it: one line per split, and the writer protocol of its own output."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from etl import columns as c
from etl.cli import main
from etl.output.manifest import read_manifest
from etl.packing.index_io import read_pack_index
from tests.commands.test_run_cli import etl
from tests.packing.test_index import make_dst

LINE = re.compile(r"^(\w+): ([\d,]+) packs, utilization (\d\.\d{4}), \d+\.\d s -> (.+)$")


def snapshot(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def packs_of(root: Path) -> set[str]:
    return {k for k in snapshot(root) if k.startswith(f"{c.PACKS_DIR}/")}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dst(tmp_path_factory.mktemp("pack_cli"), n=40)


@pytest.fixture
def dst(built: Path, tmp_path: Path) -> Path:
    """A fresh copy of one `etl run` output per test (its manifest lists relative paths)."""
    shutil.copytree(built.parent, tmp_path, dirs_exist_ok=True)
    return tmp_path / built.name


def error_line(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run the command in-process; it must fail with exit status 2 and one stderr line."""
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_one_line_per_split_and_the_index_matches_it(dst: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", str(dst), "--strategy", "bfd", "--seq-len", "128"]) == 0
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert [LINE.match(line).group(1) for line in lines] == ["train", "val"]  # type: ignore[union-attr]
    for line in lines:
        split, packs, utilization, where = LINE.match(line).groups()  # type: ignore[union-attr]
        index = read_pack_index(dst, split)
        assert index is not None and index.packing.num_packs == int(packs.replace(",", ""))
        assert utilization == f"{index.packing.utilization(128):.4f}" and where == str(dst / "packs" / split)
        assert index.seq_len == 128 and index.strategy == "bfd"
    assert "warning" in err and "examples longer than 128 tokens: " in err  # the run kept examples up to 256


def test_stream_strategy_reads_the_turns(dst: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", str(dst), "--strategy", "stream", "--seq-len", "100"]) == 0
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()] == ["train", "val"]
    index = read_pack_index(dst, "train")
    assert index is not None and index.strategy == "stream" and index.packing.trained is not None


def test_defaults_seq_len_of_the_run_and_split_choice(dst: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", str(dst), "--strategy", "sequential", "--split", "val"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("val: ") and not err
    assert read_pack_index(dst, "val").seq_len == 256  # type: ignore[union-attr]
    assert read_pack_index(dst, "train") is None


@pytest.mark.parametrize(
    "args, message",
    [
        (["--strategy", "bfd", "--split", "test"], "no split test in .*splits present are train, val"),
        (["--strategy", "sequential", "--buffer-docs", "10"], "--buffer-docs applies to --strategy bfd or ffd"),
        (["--strategy", "bfd", "--max-docs-per-bin", "0"], "--max-docs-per-bin must be at least 1"),
        (["--strategy", "bfd", "--seq-len", "0"], "--seq-len must be at least 2"),
        (["--strategy", "bfd", "--seq-len", "1"], "--seq-len must be at least 2"),
    ],
)
def test_usage_errors_are_one_line_and_touch_nothing(
    built: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(built.parent)
    assert re.search(message, error_line(capsys, "pack", str(built), *args))
    assert snapshot(built.parent) == before


def test_a_folder_that_is_not_an_etl_run_output_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "mine.txt").write_text("mine")
    err = error_line(capsys, "pack", str(tmp_path), "--strategy", "bfd")
    assert "not a finished etl output" in err and "etl run" in err
    assert snapshot(tmp_path) == {"mine.txt": hashlib.sha256(b"mine").hexdigest()}


def test_help_has_examples() -> None:
    r = etl("pack", "--help")  # the real console entry, once
    assert r.returncode == 0 and "etl pack parquet/ --strategy bfd" in r.stdout and "--buffer-docs" in r.stdout


def test_repack_replaces_the_previous_index_exactly(dst: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", str(dst), "--strategy", "bfd", "--seq-len", "64"]) == 0
    first = packs_of(dst)
    assert first == {"packs/train/part-00000.parquet", "packs/val/part-00000.parquet"}
    data = {k: v for k, v in snapshot(dst).items() if k.startswith(("data/", "turns/"))}
    assert main(["pack", str(dst), "--strategy", "sequential", "--seq-len", "512", "--split", "train"]) == 0
    record = json.loads((dst / c.PACKS_FILE).read_text())
    assert packs_of(dst) == {f["path"] for f in record["files"]} == {"packs/train/part-00000.parquet"}
    assert set(record["splits"]) == {"train"} and record["splits"]["train"]["strategy"] == "sequential"
    assert read_manifest(dst)[c.MANIFEST_PACKS] == record["splits"]  # a copy of `_packs.json`'s
    assert not (dst / c.JOURNAL_FILE).exists() and not (dst / c.LOCK_FILE).exists()
    assert {k: v for k, v in snapshot(dst).items() if k.startswith(("data/", "turns/"))} == data
    capsys.readouterr()


def test_a_users_file_under_packs_is_never_deleted_or_overwritten(
    dst: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = dst / "packs" / "train" / "part-00000.parquet"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"my own parquet")
    notes = dst / "packs" / "notes.txt"
    notes.write_text("mine")
    err = error_line(capsys, "pack", str(dst), "--strategy", "bfd")
    assert f"{mine} exists and was not written by etl; move it away" in err
    assert mine.read_bytes() == b"my own parquet" and notes.read_text() == "mine"
    assert c.MANIFEST_PACKS not in read_manifest(dst) and not (dst / c.PACKS_FILE).exists()
    mine.unlink()
    for strategy in ("bfd", "ffd"):  # the second replaces the first's index, not the user's file
        assert main(["pack", str(dst), "--strategy", strategy]) == 0
        assert notes.read_text() == "mine"
    capsys.readouterr()
    assert packs_of(dst) == {"packs/notes.txt", "packs/train/part-00000.parquet", "packs/val/part-00000.parquet"}


def test_a_rerun_removes_the_index_and_the_manifest_key(dst: Path) -> None:
    loader = pytest.importorskip("etl.loader.dataset")
    before = loader.ParquetDataset(dst, split="train").fingerprint
    assert main(["pack", str(dst), "--strategy", "bfd"]) == 0
    notes = dst / "packs" / "notes.txt"
    notes.write_text("mine")
    # The manifest gained a key; the data it lists, and so the loader's fingerprint, did not change.
    assert c.MANIFEST_PACKS in read_manifest(dst) and (dst / c.PACKS_FILE).is_file()
    assert loader.ParquetDataset(dst, split="train").fingerprint == before
    raw = dst.parent / "raw" / "chats.jsonl"
    assert main(["run", str(raw), str(dst), "--config", str(dst.parent / "cfg.json"), "--seq-len", "256",
                 "--chunk-mb", "0.002", "--quiet"]) == 0
    assert packs_of(dst) == {"packs/notes.txt"} and not (dst / c.PACKS_FILE).exists()
    assert c.MANIFEST_PACKS not in read_manifest(dst)
    assert loader.ParquetDataset(dst, split="train").fingerprint == before  # byte-identical rerun
    assert read_pack_index(dst, "train") is None


def test_left_truncation_offsets_point_at_the_last_tokens(dst: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", str(dst), "--strategy", "ffd", "--seq-len", "100", "--truncation", "left"]) == 0
    index = read_pack_index(dst, "train")
    assert index is not None and index.truncation == "left" and index.clipped > 0
    p = index.packing
    long = p.length == 100
    assert bool(np.all(p.start[~long] == 0)) and bool(np.all(p.start[long] >= 0)) and long.any()
    capsys.readouterr()
