"""Issue 26 case 7: every part carries its run's identity in its Parquet footer, and every reader
refuses a part whose identity is not the manifest's: a same-size valid part of another run copied
over a part is caught by the loader and `etl pack` too, which compare no sha256."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from etl import columns as c
from etl.cli import main
from etl.errors import EtlError
from etl.output.manifest import read_manifest
from etl.output.parquet import RUN_ID_KEY, part_identity
from tests.commands.test_run_cli import EXAMPLES
from tests.helpers import write_manifest

PART = "data/train/part-00001.parquet"


def run(dst: Path, *args: str) -> Path:
    assert main(["run", str(EXAMPLES), str(dst), "--quiet", "--chunk-mb", "0.001", *args]) == 0
    return dst


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two runs of the same input whose configs differ only in a limit no record reaches: their
    parts hold the same rows and differ only in the run identity (of the same length)."""
    root = tmp_path_factory.mktemp("identity")
    return run(root / "a"), run(root / "b", "--max-record-mb", "8")


@pytest.fixture
def swapped(runs: tuple[Path, Path], tmp_path: Path) -> Path:
    """Run a with one data part replaced by run b's part of the same name."""
    a, b = runs
    dst = Path(shutil.copytree(a, tmp_path / "a"))
    shutil.copyfile(b / PART, dst / PART)
    assert (dst / PART).stat().st_size == (a / PART).stat().st_size  # size and rows check pass
    assert pq.read_metadata(dst / PART).num_rows == pq.read_metadata(a / PART).num_rows
    return dst


def listed(dst: Path) -> list[str]:
    return [e["path"] for e in read_manifest(dst)["files"] if e["path"].endswith(".parquet")]


def test_every_part_carries_the_run_id_the_manifest_records(runs: tuple[Path, Path]) -> None:
    ids = [read_manifest(d)[c.RUN_ID] for d in runs]
    assert len(set(ids)) == 2 and all(len(i) == 16 for i in ids)  # another config, another identity
    for dst, run_id in zip(runs, ids, strict=True):
        parts = listed(dst)
        assert {p.split("/")[0] for p in parts} == {c.DATA_DIR, c.TURNS_DIR, c.REJECTS_DIR}
        for rel in parts:
            assert part_identity(pq.read_metadata(dst / rel)) == {RUN_ID_KEY: run_id}, rel


def test_a_rerun_keeps_the_identity_and_every_byte(runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = runs
    again = run(tmp_path / "again")
    assert read_manifest(again)[c.RUN_ID] == read_manifest(a)[c.RUN_ID]
    for rel in listed(a):
        assert (again / rel).read_bytes() == (a / rel).read_bytes(), rel


def _loader(dst: Path, tmp: Path) -> None:
    from etl.loader import ParquetDataset

    ParquetDataset(dst, min_tokens=0)


def _pack(dst: Path, tmp: Path) -> None:
    from etl.packing.index import build_pack_index

    build_pack_index(dst, "train", strategy="bfd", seq_len=512)


def _stats(dst: Path, tmp: Path) -> None:
    from etl.analysis.stats import run_queries

    run_queries(dst, ["lengths"])


def _inspect(dst: Path, tmp: Path) -> None:
    from etl.analysis.inspect_example import read_example

    read_example(dst, split="train", row=0)


def _export(dst: Path, tmp: Path) -> None:
    from etl.export.episodes import export_episodes

    export_episodes(dst, tmp / "episodes")


READERS: dict[str, Callable[[Path, Path], None]] = {
    "loader": _loader, "pack": _pack, "stats": _stats, "inspect": _inspect, "export": _export,
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_refuses_a_part_of_another_run(reader: str, swapped: Path, tmp_path: Path) -> None:
    with pytest.raises(EtlError) as caught:
        READERS[reader](swapped, tmp_path)
    message = str(caught.value)
    assert str(swapped / PART) in message and "another etl run" in message and "rerun `etl run`" in message
    assert "\n" not in message


def test_etl_pack_refuses_it_in_one_line(swapped: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", str(swapped), "--strategy", "bfd"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and PART in err and "rerun `etl run`" in err
    assert not (swapped / c.PACKS_FILE).exists()


def test_a_turns_or_rejects_part_of_another_run_is_refused_too(runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = runs
    for rel in ("turns/train/part-00000.parquet", "_rejects/part-00000.parquet"):
        dst = Path(shutil.copytree(a, tmp_path / rel.replace("/", "-")))
        shutil.copyfile(b / rel, dst / rel)
        with pytest.raises(EtlError, match="another etl run"):
            _stats(dst, tmp_path)


def test_a_manifest_without_run_id_is_an_older_output_and_still_reads(runs: tuple[Path, Path],
                                                                      tmp_path: Path) -> None:
    """Outputs of an etl before run identities (or sealed by hand in tests) read as before."""
    dst = Path(shutil.copytree(runs[0], tmp_path / "old"))
    manifest = read_manifest(dst)
    del manifest[c.RUN_ID]
    write_manifest(dst, manifest)
    _loader(dst, tmp_path)
    _stats(dst, tmp_path)


def assert_stamped(dst: Path) -> None:
    run_id = read_manifest(dst)[c.RUN_ID]
    for rel in listed(dst):
        assert part_identity(pq.read_metadata(dst / rel)) == {RUN_ID_KEY: run_id}, rel


def test_a_mixture_stamps_every_part(tmp_path: Path) -> None:
    from tests.pipeline.test_mixture import chats, mix_config, write_jsonl

    qa = write_jsonl(tmp_path / "in" / "qa.jsonl", chats(40))
    talk = write_jsonl(tmp_path / "in" / "talk.jsonl", chats(30, key="turns", role="speaker", text="text"))
    dst = tmp_path / "mix"
    assert main(["run", "--config", mix_config(tmp_path, qa, talk), str(dst), "--quiet"]) == 0
    assert_stamped(dst)


def test_a_run_served_by_the_token_cache_writes_the_same_stamped_parts(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = run(tmp_path / "first", "--cache", str(cache))
    second = run(tmp_path / "second", "--cache", str(cache))  # ids from the cache this time
    assert read_manifest(second)[c.RUN_ID] == read_manifest(first)[c.RUN_ID]
    assert_stamped(second)
    for rel in listed(first):
        assert (second / rel).read_bytes() == (first / rel).read_bytes(), rel
