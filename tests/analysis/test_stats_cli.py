"""`etl stats`, `report`, `inspect` from the command line: formats, --help, one-line errors."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from etl.analysis.stats import query_names, run_query
from etl.cli import main


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_stats_json_is_the_query_result(dst: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "stats", str(dst), "--query", "lengths", "--format", "json")
    assert code == 0
    assert json.loads(out) == run_query(dst, "lengths").to_pylist()
    code, out, _ = run_cli(
        capsys, "stats", str(dst), "--query", "roles", "--query", "rejects", "--format", "json"
    )
    assert set(json.loads(out)) == {"roles", "rejects"}


def test_stats_csv_round_trips(dst: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys,
        "stats",
        str(dst),
        "--query",
        "packing",
        "--seq-len",
        "64",
        "--seq-len",
        "256",
        "--format",
        "csv",
    )
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    expected = run_query(dst, "packing", seq_lens=[64, 256]).to_pylist()
    assert [(r["split"], int(r["seq_len"]), int(r["packed_lower_bound"])) for r in rows] == [
        (r["split"], r["seq_len"], r["packed_lower_bound"]) for r in expected
    ]


def test_stats_table_prints_every_query(dst: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "stats", str(dst), "--limit", "3")
    assert code == 0
    for name in query_names():
        assert f"\n{name}" in "\n" + out
    assert "more rows" in out  # length_histogram has more than 3 rows
    assert "ex-chat-1" in out and "invalid_json" in out


def test_stats_packs_without_an_index_says_how_to_make_one(
    dst: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(capsys, "stats", str(dst), "--query", "packs")
    assert code == 0 and "no pack index: `etl pack DST --strategy bfd` writes one" in out
    code, out, _ = run_cli(capsys, "stats", str(dst), "--query", "packs", "--format", "json")
    assert (code, json.loads(out)) == (0, [])


def test_stats_query_list(dst: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "stats", str(dst), "--query", "list")
    assert (code, out.split()) == (0, query_names())


def test_report_and_inspect_commands(
    dst: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(capsys, "report", str(dst), "-o", str(tmp_path / "r.html"))
    assert code == 0 and "wrote" in out and (tmp_path / "r.html").stat().st_size > 10_000
    code, out, _ = run_cli(capsys, "inspect", str(dst), "--row", "0", "--split", "val", "--plain")
    assert code == 0 and "<|asst|>[[2<|eot|>]]" in out and "── turn 2 · assistant" in out


@pytest.mark.parametrize("command", ["stats", "report", "inspect"])
def test_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert f"usage: etl {command}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args,message",
    [
        (["stats", "{missing}"], "not a finished etl output"),
        (["stats", "{dst}", "--query", "nope"], "unknown query 'nope': choose one of lengths"),
        (["stats", "{dst}", "--format", "csv"], "--format csv prints one table"),
        (["stats", "{dst}", "--bin-width", "0"], "must be positive"),
        (["report", "{missing}", "-o", "{tmp}/r.html"], "not a finished etl output"),
        (["report", "{dst}", "-o", "{tmp}"], "is a folder"),
        (["inspect", "{dst}", "--row", "99"], "row 99 is out of range"),
        (["inspect", "{dst}", "--row", "-1"], "--row must be 0 or more"),
        (["inspect", "{dst}", "--row", "0", "--split", "test"], "choose --split from: train, val"),
    ],
)
def test_errors_are_one_line(
    dst: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    filled = [a.format(dst=dst, missing=tmp_path / "missing", tmp=tmp_path) for a in args]
    code, _out, err = run_cli(capsys, *filled)
    assert code != 0
    assert err.count("\n") == 1 and err.startswith(f"etl {args[0]}: error: ") and message in err


def test_console_script_error_has_no_traceback(cli, tmp_path: Path) -> None:
    proc = cli("stats", str(tmp_path / "missing"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_histogram_table_draws_a_bar_per_nonempty_bin(
    dst: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(capsys, "stats", str(dst), "--query", "length_histogram", "--limit", "0")
    bins = run_query(dst, "length_histogram").to_pylist()
    assert code == 0
    assert sum("█" in line for line in out.splitlines()) == sum(1 for b in bins if b["examples"])
