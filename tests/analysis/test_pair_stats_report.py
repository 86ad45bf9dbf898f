"""`etl stats` and `etl report` on preference and unpaired outputs: the kind's tables and plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from etl.analysis.pair_report import LONGER, PLOTTED_ONLY, SHORTER
from etl.analysis.report import build_report, histogram_bin_width
from etl.analysis.report_plots import COLORS
from etl.analysis.stats import query_names, run_query
from etl.kinds import KINDS
from tests.analysis.pair_fixtures import (
    write_pair_dst,
)
from tests.analysis.test_stats_cli import run_cli
from tests.analysis.test_stats_report import assert_not_blank, decode, share_of_color


def test_stats_prints_the_preference_tables(pref: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "stats", str(pref))
    assert code == 0
    titles = [line.strip() for line in out.splitlines() if line.strip() in {*KINDS["preference"].queries, *query_names()}]
    assert titles == list(KINDS["preference"].queries)  # no SFT table (lengths, roles...) on pairs
    assert "pair_too_long" in out and "drop_oldest_turns" in out and "█" in out
    code, out, _ = run_cli(capsys, "stats", str(pref), "--query", "list")
    assert (code, out.split()) == (0, list(KINDS["preference"].queries))
    code, out, _ = run_cli(capsys, "stats", str(pref), "--query", "length_bias", "--format", "json")
    assert json.loads(out) == run_query(pref, "length_bias").to_pylist()
    assert json.loads(out)[-1]["chosen_longer"] == 3


def test_stats_on_pairs_names_the_queries_it_has(pref: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "stats", str(pref), "--query", "trained_share")
    assert code != 0
    assert "for a preference output" in err and "length_bias" in err


def test_stats_prints_the_unpaired_tables(kto: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "stats", str(kto), "--query", "labels", "--format", "csv")
    assert code == 0
    assert out.splitlines()[-1].startswith('"(all)",4,2,2,0.5,57,29,28,')


def test_preference_report(pref: Path) -> None:
    html = build_report(pref)
    images = decode(html)
    assert len(images) == 4  # lengths, chosen - rejected, length bias and ties, where pairs went
    for image in images:
        assert_not_blank(image)
    _lengths, difference, outcomes, drops = images
    assert share_of_color(difference, LONGER) > 0.01 and share_of_color(difference, SHORTER) > 0.01
    assert share_of_color(outcomes, COLORS[1]) > 0.01  # the score-tie segment (2 of 7 pairs)
    assert share_of_color(drops, COLORS[3]) > 0.005  # dropped: pair_too_long
    for name in KINDS["preference"].queries:
        assert (f'<h2 id="{name}">' in html) == (name not in PLOTTED_ONLY), name
    assert '<h2 id="roles">' not in html
    assert "<dt>pair fit</dt><dd>separate</dd>" in html and "<dt>kind</dt><dd>preference</dd>" in html


def test_unpaired_report(kto: Path) -> None:
    html = build_report(kto)
    images = decode(html)
    assert len(images) == 3  # lengths, label balance, where rows went
    for image in images:
        assert_not_blank(image)
    labels = images[1]
    assert share_of_color(labels, LONGER) > 0.02 and share_of_color(labels, SHORTER) > 0.02
    assert '<h2 id="labels">' in html and "pair fit" not in html


def test_report_of_a_preference_output_that_kept_no_pair(tmp_path: Path) -> None:
    counts = {"read": 1, "written": 0, "truncated": 0, "dropped": {"pair_too_long": 1}, "rejected": {}}
    html = build_report(write_pair_dst(tmp_path / "empty", "preference", [], counts, None))
    images = decode(html)
    assert len(images) == 4
    for image in images:
        assert_not_blank(image)


def test_report_bins_fit_the_longest_part(pref: Path, kto: Path) -> None:
    # ceil(longest / 32): chosen p5 has 40 tokens (the totals, up to 73, are not drawn); kto: 12.
    assert (histogram_bin_width(pref), histogram_bin_width(kto)) == (2, 1)
