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
from results_backends import (
    BARE,
    BARE_FAST,
    BARE_GIGA,
    ETL,
    ETL_HF,
    MAP,
    PER,
    all_goal,
    ratio_notes,
    side_by_side,
)
from results_etl import Data, startup_table
from results_scale import engines, memory_table, memory_verdict, optional_table

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
    assert md.ratio(0.0031) == "0.0031×" and md.ratio(0.099) == "0.099×" and md.ratio(0.1) == "0.10×"


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
    times = {ETL: [5.0, 6.0, 9.0], PER: [30.0], MAP: [15.0, 18.0, 20.0], BARE: [3.0], BARE_FAST: [2.5], BARE_GIGA: [0.1]}
    ratios, goal = ratio_notes(times)
    assert f"etl / {MAP} = **3.00×** (best rounds 3.00×)" in ratios
    assert f"etl / {BARE} = **0.50×** (best rounds 0.60×)" in ratios
    assert f"etl / {BARE_GIGA} = **0.017×** (best rounds 0.02×)" in ratios
    assert goal.startswith("Goal: etl run ≥ 8× HF datasets' batched map (num_proc=2)")
    assert goal.endswith("**3.00× on medians (3.00× on best rounds), not met**.")
    # the hf backend's own ratio to the map, and the goal met at 8x
    hf_line, met = ratio_notes({**times, ETL: [2.0, 3.0], ETL_HF: [6.0]})[1:]
    assert hf_line.startswith(f"With the hf backend (`--tokenizer-backend hf`, cold): etl / {MAP} = **3.00×**")
    assert met.endswith("**7.20× on medians (7.50× on best rounds), not met**.")
    assert ratio_notes({**times, ETL: [2.0, 2.5]})[1].endswith("**8.00× on medians (7.50× on best rounds), met**.")


def test_all_goal_is_content_rate_over_the_bare_encode_batch() -> None:
    # same contents for both: the rate ratio is bare seconds / etl seconds
    assert all_goal({ETL: [2.0, 3.0, 4.0], BARE: [7.5, 8.0]}).endswith(
        "**2.58× on medians (3.75× on best rounds), met**.")
    assert "**0.91× on medians" in all_goal({ETL: [4.4], BARE: [4.0]})


def test_memory_verdict_growth_share_and_acceptance() -> None:
    peaks = {(10, "default"): 600.0, (10, "hf"): 570.0, (50, "default"): 690.0, (50, "hf"): 580.0}
    text = memory_verdict(peaks, (10, 50))
    assert "50× / 10× median peak **1.15×**, largest median 690 MiB (hf backend: 1.02×)" in text
    assert "+30 MiB at 10×, +110 MiB at 50×" in text and text.endswith("**met**.")
    assert memory_verdict({**peaks, (50, "default"): 730.0}, (10, 50)).endswith("**not met**.")  # 1.22x
    assert memory_verdict({k: v * 2 for k, v in peaks.items()}, (10, 50)).endswith("**not met**.")  # 1,380 MiB


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
    assert [r[:2] for r in table.rows] == [["2×", "80"], ["2×", "80"], ["4×", "160"], ["4×", "160"]]
    assert "(" in table.rows[0][5]  # median (range) of 2 runs
    assert "$SLICE_X2" in table.rows[0][4] and "--tokenizer-backend hf" in table.rows[1][4]
    assert [r[6] != "-" for r in table.rows] == [True, False, True, False]  # the default's share over hf
    assert "Acceptance" in table.notes[1]


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
    # 20 chats are under auto's size threshold (AUTO_MIN_BYTES): the default run encodes with tokenizers
    assert {r[0]: r[1] for r in table.rows if r[0] in (ETL, ETL_HF, BARE_GIGA)} == {
        ETL: "hf", ETL_HF: "hf", BARE_GIGA: "gigatoken"}
    checks = [n for n in table.notes if n.startswith("Check:")]
    assert len(checks) == 3 and all("on 20 of 20 rows" in n for n in checks[:2]), checks
    assert checks[2].count("byte-identical") == 3 and "(the same)" in checks[2], checks[2]


@pytest.mark.shared
def test_bare_gigatoken_counts_the_tokens_tokenizers_counts() -> None:
    """gigatoken's own encode_batch on texts without added-token strings: tokenizers' token count."""
    if not QWEN.is_dir():
        pytest.skip(f"needs {QWEN}")
    from etl_throughput import bare_gigatoken, bare_tokenizer

    texts = ["Hello, world!", "数字 123 and emoji 🙂", "  spaces\n\ttabs  ", "", "x" * 5000]
    expected = bare_tokenizer(texts, QWEN)[1]
    assert expected > 20
    assert bare_gigatoken(texts, QWEN)[1] == expected
    assert bare_gigatoken(texts, QWEN, per_call=2)[1] == expected
