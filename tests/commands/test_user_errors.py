"""One-line errors for what users ran into: a folder inside DST given as
DST, an export onto a full disk, a --chunk-mb no machine can hold."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import etl.export.episodes
from etl.cli import main
from etl.config.build import flag_values
from etl.config.run_config import MAX_CHUNK_BYTES, RunConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "raw"


@pytest.fixture(scope="module")
def dst(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("user_errors") / "dst"
    assert main(["run", str(EXAMPLES), str(out), "--quiet"]) == 0
    return out


@pytest.mark.parametrize(("command", "below"), [
    (["stats"], "data"), (["stats"], "data/train"), (["export", "--format", "episodes"], "data"),
    (["pack", "--strategy", "bfd"], "turns/train"),
])
def test_a_folder_inside_dst_names_dst(dst: Path, tmp_path: Path, command: list[str], below: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`etl stats DST/data` once advised `etl run SRC DST/data`: it names DST, the folder above."""
    args = [command[0], str(dst / below), *([str(tmp_path / "out")] if command[0] == "export" else []),
            *command[1:]]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err == (f"etl {command[0]}: error: {dst / below} is inside the etl output {dst}; pass {dst} itself "
                   "(DST is the folder that holds _manifest.json)\n")


def test_a_folder_that_is_no_output_still_says_run_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", str(tmp_path)]) == 2
    assert "is not a finished etl output; run `etl run SRC" in capsys.readouterr().err


def test_export_on_a_full_disk_says_so(dst: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """numpy's `tofile` reports a full disk as "N requested and 0 written", without an errno."""
    def full(path: object, mode: str = "r", *args: object, **kwargs: object) -> object:
        return open("/dev/full", mode, *args, **kwargs)  # every write fails with ENOSPC

    monkeypatch.setattr(etl.export.episodes, "open", full, raising=False)
    out = tmp_path / "episodes"
    assert main(["export", str(dst), str(out), "--format", "episodes"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("etl export: error: no space left on device while writing ") and str(out) in err
    assert "internal error" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("mib", ["100000", "1024.5", "inf"])
def test_chunk_mb_is_bounded(tmp_path: Path, mib: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--chunk-mb 100000 ended in MemoryError (the reader asks for one block of that size)."""
    assert main(["run", str(EXAMPLES), str(tmp_path / "out"), "--chunk-mb", mib]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"etl run: error: --chunk-mb is {float(mib):g}; pass a positive size in MiB, "
                          "at most 1024") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_chunk_mb_at_its_bound_is_taken() -> None:
    args = argparse.Namespace(chunk_mb=1024.0)
    assert RunConfig(**flag_values(args)).chunk_bytes == MAX_CHUNK_BYTES == 1024 << 20


def test_the_bound_is_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "at most 1024 MiB" in " ".join(capsys.readouterr().out.split())
