"""Readers read exactly the listed parts; every input is counted; exit status and resume tell the
truth. Each test is built from a repro of issue 8."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from etl.cli import main
from etl.errors import EtlError, EtlWarning
from etl.output.manifest import read_manifest
from tests.commands.test_run_cli import EXAMPLES, chat, etl, write_jsonl


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("built") / "out"
    assert main(["run", str(EXAMPLES), str(dst), "--quiet", "--chunk-mb", "0.001"]) == 0
    assert len(list((dst / "data" / "train").glob("*.parquet"))) > 2
    return dst


@pytest.fixture
def dst(built: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(built, tmp_path / "out"))


PART = "data/train/part-00001.parquet"


def missing(dst: Path) -> None:
    (dst / PART).unlink()


def grown(dst: Path) -> None:
    other = dst / "data" / "train" / "part-00000.parquet"
    shutil.copyfile(other, dst / PART)  # another part's bytes under this name


def flipped(dst: Path) -> None:
    """One byte inside the input_ids pages: same size, same footer, other content."""
    group = pq.read_metadata(dst / PART).row_group(0)
    chunks = (group.column(i) for i in range(group.num_columns))
    chunk = next(c for c in chunks if c.path_in_schema.startswith("input_ids"))
    body = bytearray((dst / PART).read_bytes())
    body[chunk.data_page_offset + chunk.total_compressed_size // 2] ^= 0xFF
    (dst / PART).write_bytes(bytes(body))


def loader_reads_all(dst: Path, tmp: Path) -> int:
    from etl.loader import ParquetDataset

    ds = ParquetDataset(dst, min_tokens=0)
    ds.__getitems__(list(range(len(ds))))
    return len(ds)


READERS = {
    "stats": lambda dst, tmp: etl("stats", str(dst)),
    "report": lambda dst, tmp: etl("report", str(dst), "-o", str(tmp / "r.html")),
    "inspect": lambda dst, tmp: etl("inspect", str(dst), "--row", "0", "--plain"),
    "episodes": lambda dst, tmp: etl("export", str(dst), str(tmp / "ep"), "--format", "episodes"),
    "bin": lambda dst, tmp: etl("export", str(dst), str(tmp / "bin"), "--format", "bin"),
}


@pytest.mark.parametrize("damage", [missing, grown, flipped], ids=lambda f: f.__name__)
@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_cli_reader_catches_a_missing_or_changed_part(reader: str, damage, dst: Path, tmp_path: Path) -> None:
    damage(dst)
    r = READERS[reader](dst, tmp_path)
    assert r.returncode == 2, r.stderr
    assert PART.split("/")[-1] in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("damage", [missing, grown, flipped], ids=lambda f: f.__name__)
def test_the_loader_catches_a_missing_or_changed_part(damage, dst: Path, tmp_path: Path) -> None:
    damage(dst)
    with pytest.raises(EtlError, match=PART.split("/")[-1]):
        loader_reads_all(dst, tmp_path)


def test_an_unlisted_part_is_ignored_with_a_warning(dst: Path, tmp_path: Path) -> None:
    written = read_manifest(dst)["counts"]["written"]
    shutil.copyfile(dst / PART, dst / "data" / "train" / "part-00099.parquet")
    with pytest.warns(EtlWarning, match="part-00099"):
        assert loader_reads_all(dst, tmp_path) == written
    r = etl("stats", str(dst), "--query", "lengths", "--format", "json")
    assert r.returncode == 0 and "warning: " in r.stderr and "part-00099" in r.stderr
    assert [row["examples"] for row in json.loads(r.stdout) if row["split"] == "train"] == [written]
    for reader in ("inspect", "episodes", "bin", "report"):
        assert READERS[reader](dst, tmp_path).returncode == 0, reader


def test_an_unreadable_folder_is_counted_and_the_exit_status_says_so(tmp_path: Path, monkeypatch) -> None:
    raw = tmp_path / "raw"
    write_jsonl(raw / "a.jsonl", [chat(("user", "a"), ("assistant", "b"))])
    write_jsonl(raw / "locked" / "b.jsonl", [chat(("user", "c"), ("assistant", "d"))] * 3)
    real = os.scandir

    def scandir(path: object = ".") -> object:  # what chmod 000 does for a non-root user
        if Path(os.fsdecode(path)).name == "locked":
            raise PermissionError(13, "Permission denied", os.fsdecode(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert main(["run", str(raw), str(tmp_path / "out"), "--quiet"]) == 3
    manifest = read_manifest(tmp_path / "out")
    counts = manifest["counts"]
    assert counts["rejected"] == {"unreadable_dir": 1} and counts["read"] == 2
    assert manifest["incomplete_inputs"][0]["path"] == "locked/"
    rejects = pq.read_table(tmp_path / "out" / "_rejects").to_pylist()
    assert [(r["source_file"], r["reason"]) for r in rejects] == [("locked/", "unreadable_dir")]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads folders whatever their mode")
def test_a_folder_without_permissions_is_counted(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    write_jsonl(raw / "a.jsonl", [chat(("user", "a"), ("assistant", "b"))])
    write_jsonl(raw / "locked" / "b.jsonl", [chat(("user", "c"), ("assistant", "d"))])
    (raw / "locked").chmod(0)
    try:
        r = etl("run", str(raw), str(tmp_path / "out"))
        assert r.returncode == 3 and "locked" in r.stderr
        r = etl("run", str(raw / "locked"), str(tmp_path / "out2"))
        assert r.returncode == 2 and "permission denied" in r.stderr
    finally:
        (raw / "locked").chmod(0o755)


def test_a_truncated_archive_is_rejected_whole_and_exits_3(tmp_path: Path) -> None:
    recs = [chat(("user", f"question {i} " + "x" * 200), ("assistant", f"answer {i}")) for i in range(400)]
    body = gzip.compress("".join(json.dumps(r) + "\n" for r in recs).encode())
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "cut.jsonl.gz").write_bytes(body[: len(body) // 2])
    write_jsonl(raw / "ok.jsonl", recs[:5])
    r = etl("run", str(raw), str(tmp_path / "out"), "--chunk-mb", "0.01")
    assert r.returncode == 3, r.stderr
    manifest = read_manifest(tmp_path / "out")
    lost = manifest["incomplete_inputs"]
    # Its intact first half is not kept either (a damaged archive trains nothing).
    assert [(i["path"], i["reason"], i["records_read"]) for i in lost] == [("cut.jsonl.gz", "corrupt_file", 0)]
    assert "cut.jsonl.gz: failed its integrity check; none of its records were used" in r.stderr
    assert "exit status 3" in r.stderr
    written = pq.read_table(tmp_path / "out" / "data").num_rows
    assert written == manifest["counts"]["written"] == 5
    quiet = etl("run", str(raw), str(tmp_path / "out"), "--quiet")  # --quiet still warns
    assert quiet.returncode == 3 and "integrity check" in quiet.stderr
    clean = etl("run", str(raw / "ok.jsonl"), str(tmp_path / "out"), "--quiet")
    assert clean.returncode == 0 and clean.stderr == ""


def test_a_resume_onto_other_data_is_refused(tmp_path: Path) -> None:
    from etl.loader import ParquetLoader

    def run(name: str, answer: str) -> Path:
        src = write_jsonl(tmp_path / answer / "chats.jsonl",
                          [chat(("user", f"q{i}"), ("assistant", answer)) for i in range(8)])
        assert main(["run", str(src), str(tmp_path / name), "--quiet"]) == 0
        return tmp_path / name

    a, b, a_again = run("a", "yes"), run("b", "no!"), run("a_again", "yes")
    assert read_manifest(a)["counts"] == read_manifest(b)["counts"]  # same rows, other tokens
    loader = ParquetLoader(a, batch_size=2, seed=0)
    next(iter(loader))
    state = json.loads(json.dumps(loader.state_dict()))  # as a checkpoint stores it
    with pytest.raises(EtlError, match="other data.*fingerprint"):
        ParquetLoader(b, batch_size=2, seed=0).load_state_dict(state)
    with pytest.raises(EtlError, match="seq_len"):
        ParquetLoader(a, batch_size=2, seed=0, seq_len=4096).load_state_dict(state)
    resumed = ParquetLoader(a_again, batch_size=2, seed=0)  # a byte-identical rerun elsewhere
    resumed.load_state_dict(state)
    assert resumed.position == 1

