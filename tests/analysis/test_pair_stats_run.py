"""`etl stats` / `etl report` on real `etl run --input-type preference|unpaired` outputs.

Inputs: tests/assets/preference/{pairs,unpaired}.jsonl with the default `bytes` tokenizer and
`ngpt` template, where a completion is its UTF-8 bytes plus one end-of-turn token: so chosen -
rejected is the byte difference of the two last messages, worked out by hand below. Other figures
are recounted from the Parquet lists themselves and compared with the run's manifest.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from etl import columns as C
from etl.analysis.report import build_report
from etl.analysis.stats import run_queries
from etl.cli import main
from tests.analysis.recount import keyed, table
from tests.analysis.stats_fixtures import REPO
from tests.analysis.test_stats_report import assert_not_blank, decode

ASSETS = REPO / "tests" / "assets" / "preference"


def run(src: str, dst: Path, kind: str, seq_len: int) -> dict:
    args = ["run", str(ASSETS / src), str(dst), "--input-type", kind, "--seq-len", str(seq_len)]
    assert main([*args, "--quiet"]) == 0
    return json.loads((dst / C.MANIFEST_FILE).read_text(encoding="utf-8"))


def lengths(dst: Path, column: str) -> np.ndarray:
    return np.array([len(v) for v in table(dst, C.DATA_DIR).column(column).to_pylist()])


def test_stats_and_report_of_a_preference_run(tmp_path: Path) -> None:
    dst = tmp_path / "pref"
    manifest = run("pairs.jsonl", dst, "preference", 256)
    results = run_queries(dst)
    prompt, chosen, rejected = (lengths(dst, c) for c in (C.PROMPT_IDS, C.CHOSEN_IDS, C.REJECTED_IDS))
    pairs = keyed(results["pairs"], "split")["(all)"]
    assert (pairs["pairs"], pairs["prompt_tokens"], pairs["chosen_tokens"], pairs["rejected_tokens"]) == (
        manifest["counts"]["written"], prompt.sum(), chosen.sum(), rejected.sum())
    assert pairs["tokens"] == prompt.sum() + chosen.sum() + rejected.sum()
    # Lines 0-4 are kept. chosen - rejected in bytes: "It is blue." 11 - "It is green." 12 = -1;
    # "3." 2 - "4 is prime." 11 = -9; "Bonjour !" 9 - "Hello." 6 = 3; the haiku 72 - "Rain." 5 =
    # 67; ">dne_mi|<" 9 - "<|im_end|>" 10 = -1. Sorted [-9,-1,-1,3,67]: median -1, mean 59/5.
    bias = keyed(results["length_bias"], "split")["(all)"]
    assert [bias[k] for k in ("pairs", "chosen_longer", "equal_length", "chosen_shorter",
                              "median_difference", "mean_difference")] == [5, 2, 0, 3, -1, 11.8]  # fmt: skip
    difference = results["length_difference"].to_pylist()
    assert sum(r["pairs"] for r in difference) == 5
    assert sum(r["pairs"] for r in difference if r["bin_start"] > 0) == 2  # chosen longer only
    # Scores on lines 0 (8 > 2.5) and 1 (9 = 9) only.
    scores = keyed(results["scores"], "split")["(all)"]
    assert [scores[k] for k in ("scored", "ties", "chosen_higher", "chosen_lower", "mean_margin")] == [
        2, 1, 1, 0, 2.75]  # fmt: skip
    # Lines 5-8: chosen == rejected, an empty chosen, differing implicit prompts, no "rejected".
    drops = {(r["stage"], r["reason"]): r for r in results["drops"].to_pylist()}
    for reason in ("chosen_equals_rejected", "empty_completion", "prompts_differ", "missing_key"):
        assert (drops["rejected", reason]["manifest"], drops["rejected", reason]["observed"]) == (1, 1)
    assert drops["accounting_gap", None]["manifest"] == 0
    html = build_report(dst)
    images = decode(html)
    assert len(images) == 4
    for image in images:
        assert_not_blank(image)


def test_truncation_of_a_preference_run(tmp_path: Path) -> None:
    # At S = 60 the multi-turn pair (line 1) loses prompt turns and longer pairs are dropped.
    dst = tmp_path / "pref60"
    manifest = run("pairs.jsonl", dst, "preference", 60)
    results = run_queries(dst)
    data = table(dst, C.DATA_DIR).to_pylist()
    got = keyed(results["truncation"], "split")["(all)"]
    assert (got["policy"], got["fit"], got["seq_len"]) == ("drop_oldest_turns", "separate", 60)
    shared = sum(len(r[C.PROMPT_IDS]) + len(r[C.CHOSEN_IDS]) + len(r[C.REJECTED_IDS]) > 60 for r in data)
    assert got["over_shared_seq_len"] == got["manifest_over_shared_seq_len"] == shared
    assert got["truncated"] == manifest["counts"]["truncated"] == sum(r[C.TRUNCATED] for r in data) >= 1
    assert got["prompt_turns_dropped"] == sum(r[C.NUM_TURNS_DROPPED] for r in data) >= 1
    dropped = [(r["reason"], r["manifest"]) for r in results["drops"].to_pylist() if r["stage"] == "dropped"]
    assert dropped == sorted(manifest["counts"]["dropped"].items()) and dict(dropped)["pair_too_long"] >= 1
    lengths_ = keyed(results["part_lengths"], "split", "part")
    assert lengths_["(all)", "total"]["max"] == max(len(r[C.PROMPT_IDS]) + len(r[C.CHOSEN_IDS])
                                                    + len(r[C.REJECTED_IDS]) for r in data)  # fmt: skip


def test_stats_and_report_of_an_unpaired_run(tmp_path: Path) -> None:
    dst = tmp_path / "kto"
    run("unpaired.jsonl", dst, "unpaired", 256)
    results = run_queries(dst)
    # Kept: true "It is blue." (11 bytes + end-of-turn = 12), false "It is green." (13), false
    # "Rain." (6); rejected: the label "yes", the empty completion.
    labels = keyed(results["labels"], "split")["(all)"]
    assert [labels[k] for k in ("rows", "desirable", "undesirable", "mean_completion_desirable",
                                "mean_completion_undesirable")] == [3, 1, 2, 12.0, 9.5]  # fmt: skip
    assert labels["tokens"] == lengths(dst, C.PROMPT_IDS).sum() + lengths(dst, C.COMPLETION_IDS).sum()
    rejects = {r["reason"]: r["rejects"] for r in results["rejects"].to_pylist()}
    assert rejects == {"label_not_bool": 1, "empty_completion": 1}
    images = decode(build_report(dst))
    assert len(images) == 3
    for image in images:
        assert_not_blank(image)
