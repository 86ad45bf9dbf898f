"""A run that read input and wrote nothing is not a success: exit status 4.

Before, `read 2,312, written 0, rejected 2,312 (missing_key 2,312)` exited 0.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

import etl.engine.ray_run
from etl.analysis.run_summary import run_outcome
from etl.cli import main
from etl.errors import EXIT_EMPTY, EXIT_INCOMPLETE
from etl.output.manifest import read_manifest
from etl.pipeline.run import LocalEngine

SHAREGPT = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}


def write_jsonl(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.mark.parametrize("quiet", [[], ["--quiet"]])
def test_every_record_rejected_exits_4_and_keeps_the_hint(tmp_path: Path, quiet: list[str],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    src = write_jsonl(tmp_path / "sg.jsonl", [SHAREGPT] * 3)
    assert main(["run", str(src), str(tmp_path / "out"), *quiet]) == EXIT_EMPTY == 4
    err = capsys.readouterr().err.splitlines()
    assert "try --input-type sharegpt" in err[-2]
    assert err[-1] == (f"etl run: error: nothing written: all 3 records read were rejected or dropped; "
                       f"`etl stats {tmp_path / 'out'} --query rejects` says why (exit status 4)")
    counts = read_manifest(tmp_path / "out")["counts"]  # the run finished: its manifest says what happened
    assert (counts["read"], counts["written"], counts["rejected"]) == (3, 0, {"missing_key": 3})


def test_every_record_dropped_exits_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Dropped, not rejected: a user-only chat has no trained token."""
    src = write_jsonl(tmp_path / "u.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}] * 2)
    assert main(["run", str(src), str(tmp_path / "out"), "--quiet"]) == EXIT_EMPTY
    assert f"all 2 records read were rejected or dropped; `etl stats {tmp_path / 'out'} --query drops` says why" \
        in capsys.readouterr().err


def test_one_record_written_is_a_success(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "mixed.jsonl", [SHAREGPT, CHAT])
    assert main(["run", str(src), str(tmp_path / "out"), "--quiet"]) == 0


def test_an_empty_input_has_nothing_to_write_and_exits_0(tmp_path: Path) -> None:
    """Nothing read is not input lost: an empty file (or folder of them) is an empty dataset."""
    (tmp_path / "empty.jsonl").write_text("", encoding="utf-8")
    assert main(["run", str(tmp_path / "empty.jsonl"), str(tmp_path / "out"), "--quiet"]) == 0


def test_a_mixture_that_writes_nothing_exits_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", [SHAREGPT] * 2)
    b = write_jsonl(tmp_path / "b.jsonl", [SHAREGPT] * 3)
    config = tmp_path / "mix.toml"
    config.write_text(f'[[sources]]\npath = "{a}"\nweight = 1\n[[sources]]\npath = "{b}"\nweight = 2\n')
    assert main(["run", "--config", str(config), str(tmp_path / "out"), "--quiet"]) == EXIT_EMPTY
    assert "all 5 records read were rejected or dropped" in capsys.readouterr().err


def test_the_ray_engine_gets_the_same_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The status is read from the manifest every engine writes (Ray's run here is the local one)."""
    monkeypatch.setattr(etl.engine.ray_run, "require_ray", lambda: None)
    monkeypatch.setattr(etl.engine.ray_run, "RayEngine", lambda *args, **kwargs: LocalEngine())
    src = write_jsonl(tmp_path / "sg.jsonl", [SHAREGPT] * 2)
    assert main(["run", str(src), str(tmp_path / "out"), "--engine", "ray", "--quiet"]) == EXIT_EMPTY


def test_a_damaged_file_as_the_only_input_exits_4_and_is_named(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    z = bytearray(gzip.compress("".join(json.dumps(CHAT) + "\n" for _ in range(50)).encode()))
    z[-6] ^= 0x10  # the gzip trailer's CRC: the file fails its integrity check, no record is used
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl.gz").write_bytes(bytes(z))
    assert main(["run", str(tmp_path / "in"), str(tmp_path / "out"), "--quiet"]) == EXIT_EMPTY
    err = capsys.readouterr().err
    assert "a.jsonl.gz" in err and err.endswith("(exit status 4, which outranks 3)\n")
    assert "(exit status 3)" not in err  # one status named, not two
    assert read_manifest(tmp_path / "out")["counts"]["written"] == 0


def _status(manifest: dict) -> int:
    """etl run's exit status for `manifest`, its lines printed as etl run prints them."""
    status, lines = run_outcome(manifest, "DST", quiet=True)
    print("\n".join(lines), file=sys.stderr)
    return status


def test_nothing_written_wins_over_incomplete_input(capsys: pytest.CaptureFixture[str]) -> None:
    """The only input is a damaged file whose records were all rejected: 4, not 3 (an output with
    nothing to train on is unusable whatever the reason); the damaged file is still named."""
    manifest = {"counts": {"read": 7, "written": 0, "dropped": {}, "rejected": {"corrupt_file": 7}},
                "incomplete_inputs": [{"path": "a.jsonl.gz", "reason": "corrupt_file", "records_read": 7,
                                       "error": "CRC check failed"}]}
    assert _status(manifest) == EXIT_EMPTY
    err = capsys.readouterr().err
    assert "a.jsonl.gz" in err and err.endswith("all 7 records read were rejected or dropped; `etl stats DST "
                                                "--query rejects` says why (exit status 4, which outranks 3)\n")
    manifest["counts"]["written"] = 1
    assert _status(manifest) == EXIT_INCOMPLETE
