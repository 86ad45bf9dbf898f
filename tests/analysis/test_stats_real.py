"""Report, inspect and notebook on the output of the real `etl run` (skipped until it exists)."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from etl.analysis.inspect_example import read_example, read_turns, render_plain, token_strings
from etl.analysis.report import build_report
from etl.analysis.stats import run_queries
from etl.output.manifest import read_manifest
from tests.analysis.test_stats_inspect import MARKER, trained_runs
from tests.analysis.test_stats_notebook import execute, text_of
from tests.analysis.test_stats_report import assert_not_blank, decode


def test_real_output_is_consistent(real_dst: Path) -> None:
    results = run_queries(real_dst)
    assert all(r["violations"] == 0 for r in results["consistency"].to_pylist()), results[
        "consistency"
    ].to_pylist()
    drops = {(r["stage"], r["reason"]): r for r in results["drops"].to_pylist()}
    assert drops[("accounting_gap", None)]["manifest"] == 0
    assert drops[("rejected", "invalid_json")]["observed"] == 1
    assert results["zero_trained"].num_rows == 0
    assert results["untrained_eot"].num_rows == 0  # default: every assistant end-of-turn trained
    assert results["lengths"].to_pylist()[-1]["max"] <= read_manifest(real_dst)["seq_len"]


def test_report_on_real_output(real_dst: Path) -> None:
    images = decode(build_report(real_dst))
    assert len(images) == 4
    for image in images:
        assert_not_blank(image)


def test_inspect_on_real_output(real_dst: Path) -> None:
    manifest = read_manifest(real_dst)
    for split in sorted(p.name for p in (real_dst / "data").iterdir()):
        rows = sum(
            pq.ParquetFile(f).metadata.num_rows
            for f in (real_dst / "data" / split).glob("*.parquet")
        )
        for row in sorted({0, rows // 2, rows - 1}):
            example = read_example(real_dst, split=split, row=row)
            turns = read_turns(real_dst, split=split, example_id=example["id"])
            strings = token_strings(manifest, example["input_ids"])
            body = render_plain(example, turns, strings).split("\n\n", 1)[1]
            assert re.findall(r"\[\[(.*?)\]\]", body, re.DOTALL) == trained_runs(
                example, turns, strings
            )
            assert len(MARKER.findall(body)) == sum(t["kept"] for t in turns)


def test_notebook_on_real_output(
    real_dst: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outputs = execute(real_dst, tmp_path, monkeypatch)
    assert not [o for o in outputs if o.output_type == "error"]
    assert "accounting gap (must be 0): 0" in text_of(outputs)
