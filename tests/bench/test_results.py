"""bench/results.py: the markdown writer on rows, the timings parser, optional sections, and the
sections that run `etl run` on tiny synthetic chats (bytes tokenizer). No figure is asserted."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))  # the bench modules import each other by name, as scripts do

import results_md as md
from child import Run, run_child
from results_etl import Data, ratio_notes, side_by_side, startup_table
from results_scale import engines, memory_table, optional_table

QWEN = BENCH.parents[1] / "shared" / "data" / "qwen2.5-tokenizer"


def test_table_lines_align_and_escape() -> None:
    lines = md.table_lines(["job", "command", "s"], [["a", "`x | y`", "1.00"]])
    assert lines[1] == "|---|---|---:|"
    assert lines[2] == "| a | `x \\| y` | 1.00 |"


def test_render_numbers_sections_and_keeps_notes() -> None:
    tables = [md.Table("first", ["a", "b"], [["1", "2"]], ["a note"]), md.Table("second", [], notes=["only a note"])]
    text = md.render("title", ["header line"], tables)
    assert text.startswith("# title\n\nheader line\n\n## 1. first\n\n| a | b |")
    assert "a note" in text and "## 2. second\n\nonly a note\n" in text


def test_number_formats() -> None:
    assert md.secs([2.0]) == "2.00"
    assert md.secs([3.0, 1.0, 2.0]) == "2.00 (1.00-3.00)"
    assert md.secs([559.4, 679.6], 0) == "620 (559-680)"
    assert md.rate(3_000_000, 2.0) == "1.50M"
    assert md.ratio(2.5) == "2.50×"


def test_parse_timings() -> None:
    line = "noise\netl run timings: total 4.20s, tokenize_plan 3.61s, startup 0.41s, parse 0.46s\n"
    assert md.parse_timings(line) == {"total": 4.2, "tokenize_plan": 3.61, "startup": 0.41, "parse": 0.46}
    assert md.parse_timings("no timings here") == {}


@pytest.mark.parametrize(("value", "columns", "rows", "notes"), [
    ("| a |\n|---|", [], [], ["| a |\n|---|"]),
    ([{"x": 1, "y": 2}, {"x": 3}], ["x", "y"], [[1, 2], [3, ""]], []),
    ((["x"], [[1], [2]]), ["x"], [[1], [2]], []),
])
def test_from_results_shapes(value: object, columns: list[str], rows: list[list[object]], notes: list[str]) -> None:
    table = md.from_results("t", value)
    assert (table.columns, table.rows, table.notes) == (columns, rows, notes)


def test_ratio_notes_on_medians_and_best_rounds() -> None:
    times = {"etl run": [5.0, 6.0, 9.0], "per-example loop": [30.0], "HF datasets map": [15.0, 18.0, 20.0],
             "bare encode_batch": [3.0], "bare encode_batch_fast": [2.5]}
    ratios, goal = ratio_notes(times)
    assert "etl / HF datasets map = **3.00×** (best rounds 3.00×)" in ratios
    assert "etl / bare encode_batch = **0.50×** (best rounds 0.60×)" in ratios
    assert goal.endswith("**3.00× on medians (3.00× on best rounds), met**.")


def test_optional_table_missing_and_present(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "Not available in this build" in optional_table("no_such_bench_module", "t").notes[0]
    fake = types.ModuleType("fake_bench")
    fake.results = lambda: [{"engine": "local", "s": "1.0"}]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_bench", fake)
    table = optional_table("fake_bench", "t")
    assert table.columns == ["engine", "s"] and table.rows == [["local", "1.0"]]
    fake.results = lambda: 1 / 0  # type: ignore[attr-defined]
    assert "failed: ZeroDivisionError" in optional_table("fake_bench", "t").notes[0]


def test_child_peak_is_its_own_not_the_callers() -> None:
    """A direct child's ru_maxrss would start at this process's size; the launcher's does not."""
    ballast = bytearray(300 << 20)
    ballast[:: 4096] = b"\x01" * len(ballast[:: 4096])  # touch every page: 300 MiB resident here
    run = run_child(["true"])
    assert run.peak_mib < 100, run
    assert len(ballast) == 300 << 20


def tiny_data(tmp_path: Path, tokenizer: Path | str, rows: int = 40) -> Data:
    chats = tmp_path / "chats.jsonl"
    lines = [json.dumps({"messages": [{"role": "user", "content": f"question {i}?"},
                                      {"role": "assistant", "content": f"answer {i}."}]}) for i in range(rows)]
    chats.write_text("\n".join(lines) + "\n", encoding="utf-8")
    contents = [t for i in range(rows) for t in (f"question {i}?", f"answer {i}.")]
    return Data(tmp_path, Path(tokenizer), chats, contents, {str(chats): "$T0_CHATS"})


def test_memory_table_runs_etl_on_repeated_input(tmp_path: Path) -> None:
    data = tiny_data(tmp_path, "bytes")
    table = memory_table(data, data.chats, 40, (2, 4), rounds=2)
    assert [r[:2] for r in table.rows] == [["2×", "80"], ["4×", "160"]]
    assert "(" in table.rows[0][4]  # median (range) of 2 runs
    assert "$SLICE_X2" in table.rows[0][3] and "Acceptance" in table.notes[0]


def test_startup_from_timings_line_or_measured(tmp_path: Path) -> None:
    data = tiny_data(tmp_path, "bytes")
    runs = [Run(1.0, 1.0, 1, f"etl run timings: total 1.00s, startup {s}s, parse 0.10s") for s in ("0.30", "0.40", "0.90")]
    table = startup_table(data, runs, 1)
    assert table.rows == [["startup", "`etl run ... --timings` (the side-by-side's etl runs)", "0.40 (0.30-0.90)"]]
    assert "**met**" in table.notes[0]
    measured = startup_table(data, [Run(1.0, 1.0, 1, "etl run timings: total 1.00s")], 1)
    assert len(measured.rows) == 3 and "no `startup` figure" in measured.notes[0]
    assert measured.notes[1].startswith("Imports + tokenizer load: **")


def test_engines_says_when_it_measured_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # bench/engines.py itself runs T0 for minutes: stand in for it.
    import results_scale

    stub = types.SimpleNamespace(results=list)
    monkeypatch.setattr(results_scale, "optional_module", lambda name: stub)
    table = engines(tiny_data(tmp_path, "bytes"), 1)
    assert table.rows == [] and "Not measured" in table.notes[0]
    stub.results = lambda: [{"name": "etl run --engine ray", "seconds": 2.0}]
    assert engines(tiny_data(tmp_path, "bytes"), 1).rows


@pytest.mark.shared
@pytest.mark.slow
def test_side_by_side_peers_equal_etl(tmp_path: Path) -> None:
    """The peers (transformers' chat template) write etl's ids and masks on every row."""
    if not QWEN.is_dir():
        pytest.skip(f"needs {QWEN}")
    table = side_by_side(tiny_data(tmp_path, QWEN, rows=20), 1, [])
    assert [r[0] for r in table.rows][:3] == ["etl run", "per-example loop", "HF datasets map"]
    checks = [n for n in table.notes if n.startswith("Check:")]
    assert len(checks) == 2 and all("on 20 of 20 rows" in n for n in checks), checks
