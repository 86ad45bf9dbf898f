"""The preference and unpaired queries (sql/preference/) against figures worked out by hand.

The outputs are tests/analysis/pair_fixtures.py's: seven pairs (lengths prompt/chosen/rejected in
PAIRS) and four unpaired rows. Every expected value below is counted from those tables by hand
(sorted lists and inverted-CDF percentiles written out where a percentile is asserted).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl import columns as C
from etl.analysis.pair_stats import output_kind
from etl.analysis.stats import query_names, run_queries, run_query
from etl.errors import EtlError
from etl.kinds import KINDS
from tests.analysis.pair_fixtures import (
    write_pair_dst,
)
from tests.analysis.recount import keyed


def rows(table: object, *keys: str) -> list[tuple]:
    return [tuple(r[k] for k in keys) for r in table.to_pylist()]  # type: ignore[attr-defined]


def test_every_pair_query_is_tested_here() -> None:
    tested = {n.removeprefix("test_") for n in globals() if n.startswith("test_")}
    assert {n for kind in KINDS.values() for n in kind.queries} <= tested


def test_pairs(pref: Path) -> None:
    # train: prompt 10+20+5+30+8 = 73, chosen 6+3+2+12+40 = 63, rejected 4+3+9+1+25 = 42;
    # val: prompt 4+12, chosen 7+1, rejected 7+5. p4's chosen has 2 untrained tokens.
    # unshared = 2*prompt + chosen + rejected; saving = prompt / unshared (73/251, 16/52, 89/303).
    got = rows(run_query(pref, "pairs"), "split", "pairs", "tokens", "prompt_tokens",
               "chosen_tokens", "rejected_tokens", "chosen_trained", "rejected_trained",
               "unshared_tokens", "shared_saving")  # fmt: skip
    assert got == [
        ("train", 5, 178, 73, 63, 42, 61, 42, 251, 0.2908),
        ("val", 2, 36, 16, 8, 12, 8, 12, 52, 0.3077),
        ("(all)", 7, 214, 89, 71, 54, 69, 54, 303, 0.2937),
    ]


def test_part_lengths(pref: Path) -> None:
    # (all) sorted: prompt [4,5,8,10,12,20,30], chosen [1,2,3,6,7,12,40],
    # rejected [1,3,4,5,7,9,25], total [16,18,18,20,26,43,73]; n = 7: p50 is the 4th, p90 and
    # p99 the 7th. train prompt [5,8,10,20,30]: p50 3rd, p90 5th; val prompt [4,12]: p50 1st.
    got = keyed(run_query(pref, "part_lengths"), "split", "part")
    keys = ("rows", "tokens", "min", "p50", "p90", "p99", "max", "mean")
    assert [k[1] for k in got if k[0] == "(all)"] == ["prompt", "chosen", "rejected", "total"]
    assert {k[0] for k in got} == {"train", "val", "(all)"}
    expected = {
        ("(all)", "prompt"): (7, 89, 4, 10, 30, 30, 30, 12.71),
        ("(all)", "chosen"): (7, 71, 1, 6, 40, 40, 40, 10.14),
        ("(all)", "rejected"): (7, 54, 1, 5, 25, 25, 25, 7.71),
        ("(all)", "total"): (7, 214, 16, 20, 73, 73, 73, 30.57),
        ("train", "prompt"): (5, 73, 5, 10, 30, 30, 30, 14.6),
        ("val", "prompt"): (2, 16, 4, 4, 12, 12, 12, 8.0),
        ("val", "total"): (2, 36, 18, 18, 18, 18, 18, 18.0),
    }
    for key, values in expected.items():
        assert tuple(got[key][k] for k in keys) == values, key


def test_part_length_histogram(pref: Path) -> None:
    # Bins of 10 up to the longest part (chosen 40): 0, 10, 20, 30, 40 for every part.
    got = run_query(pref, "part_length_histogram", bin_width=10)
    by_part: dict[str, list[int]] = {}
    for part, start, end, n in rows(got, "part", "bin_start", "bin_end", "rows"):
        assert end - start == 10 and start == 10 * len(by_part.get(part, []))
        by_part.setdefault(part, []).append(n)
    assert by_part == {
        "prompt": [3, 2, 1, 1, 0],  # 5 8 4 | 10 12 | 20 | 30
        "chosen": [5, 1, 0, 0, 1],  # 6 3 2 7 1 | 12 | 40
        "rejected": [6, 0, 1, 0, 0],  # 4 3 9 1 7 5 | 25
    }


def test_length_bias(pref: Path) -> None:
    # chosen - rejected: train [2, 0, -7, 11, 15], val [0, -4].
    got = rows(run_query(pref, "length_bias"), "split", "pairs", "chosen_longer", "equal_length",
               "chosen_shorter", "chosen_longer_share", "equal_share", "chosen_shorter_share",
               "mean_difference", "median_difference")  # fmt: skip
    assert got == [
        ("train", 5, 3, 1, 1, 0.6, 0.2, 0.2, 4.2, 2),  # sorted [-7,0,2,11,15]: 3rd
        ("val", 2, 0, 1, 1, 0.0, 0.5, 0.5, -2.0, -4),  # sorted [-4,0]: 1st
        ("(all)", 7, 3, 2, 2, 0.4286, 0.2857, 0.2857, 2.43, 0),  # 17/7; [-7,-4,0,0,2,11,15]: 4th
    ]


def test_length_difference(pref: Path) -> None:
    # Bins of 5 with 0 alone: -7 -> [-10,-5), -4 -> [-5,0), 0 0 -> [0,1), 2 -> [1,6),
    # 11 15 -> [11,16); [6,11) empty but kept.
    got = rows(run_query(pref, "length_difference", bin_width=5), "bin_start", "bin_end", "pairs")
    assert got == [(-10, -5, 1), (-5, 0, 1), (0, 1, 2), (1, 6, 1), (6, 11, 0), (11, 16, 2)]
    # Width 1: every difference its own bin, from -7 to 15.
    got = rows(run_query(pref, "length_difference", bin_width=1), "bin_start", "bin_end", "pairs")
    assert [(s, e) for s, e, _ in got] == [(d, d + 1) for d in range(-7, 16)]
    assert {s: n for s, _, n in got if n} == {-7: 1, -4: 1, 0: 2, 2: 1, 11: 1, 15: 1}
    # Bins wider than every difference: one bin each side of the zero bin.
    wide = run_query(pref, "length_difference", bin_width=100)
    assert rows(wide, "bin_start", "bin_end", "pairs") == [(-100, 0, 2), (0, 1, 2), (1, 101, 3)]


def test_scores(pref: Path) -> None:
    # p1 8>2.5, p2 9=9, p3 none, p4 1<3, p5 one score only (not scored), p6 .5=.5, p7 3>1.
    got = rows(run_query(pref, "scores"), "split", "pairs", "scored", "ties", "chosen_higher",
               "chosen_lower", "tie_share", "mean_margin")  # fmt: skip
    assert got == [
        ("train", 5, 3, 1, 1, 1, 0.3333, 1.1667),  # margins 5.5, 0, -2
        ("val", 2, 2, 1, 1, 0, 0.5, 1.0),  # margins 0, 2
        ("(all)", 7, 5, 2, 2, 1, 0.4, 1.1),  # 5.5 / 5
    ]


def test_truncation(pref: Path) -> None:
    # Truncated: p4 (2 prompt turns dropped), p7 (1). Over S = 64 in the shared layout: p5 (73).
    got = rows(run_query(pref, "truncation"), "split", "policy", "fit", "seq_len", "pairs",
               "truncated", "truncated_share", "pairs_with_turns_dropped", "prompt_turns_dropped",
               "over_shared_seq_len", "manifest_over_shared_seq_len")  # fmt: skip
    assert got == [
        ("train", "drop_oldest_turns", "separate", 64, 5, 1, 0.2, 1, 2, 1, None),
        ("val", "drop_oldest_turns", "separate", 64, 2, 1, 0.5, 1, 1, 0, None),
        ("(all)", "drop_oldest_turns", "separate", 64, 7, 2, 0.2857, 2, 3, 1, 1),
    ]


def test_drops(pref: Path) -> None:
    # read 11 = written 7 + dropped 2 (pair_too_long) + rejected 2: the gap is 0.
    got = rows(run_query(pref, "drops"), "stage", "reason", "manifest", "observed")
    assert got == [
        ("read", None, 11, None),
        ("written", None, 7, 7),
        ("truncated", None, 2, 2),
        ("turns_dropped", None, None, 3),
        ("dropped", "pair_too_long", 2, None),
        ("rejected", "chosen_equals_rejected", 1, 1),
        ("rejected", "empty_completion", 1, 1),
        ("accounting_gap", None, 0, None),
    ]


def test_rejects(pref: Path) -> None:
    got = rows(run_query(pref, "rejects"), "reason", "rejects", "first_at")
    assert got == [("chosen_equals_rejected", 1, "pairs.jsonl:5"), ("empty_completion", 1, "pairs.jsonl:6")]


def test_packing(pref: Path) -> None:
    # num_tokens (the prefix-shared layout) train [20,26,16,43,73], val [18,18], S = 64:
    # train kept 20+26+16+43+64 = 169 -> ceil(169/64) = 3; longer than 32: 43, 73 -> bound 3.
    got = rows(run_query(pref, "packing"), "split", "seq_len", "tokens", "longer_than_seq_len",
               "stream_sequences", "packed_lower_bound")  # fmt: skip
    assert got == [("train", 64, 178, 1, 3, 3), ("val", 64, 36, 0, 1, 1)]


def test_labels(kto: Path) -> None:
    # u1 T (10+5), u2 F (10+9), u3 F (6+2, truncated), u4 T val (3+12).
    got = rows(run_query(kto, "labels"), "split", "rows", "desirable", "undesirable",
               "desirable_share", "tokens", "prompt_tokens", "completion_tokens",
               "mean_completion_desirable", "mean_completion_undesirable", "truncated")  # fmt: skip
    assert got == [
        ("train", 3, 1, 2, 0.3333, 42, 26, 16, 5.0, 5.5, 1),
        ("val", 1, 1, 0, 1.0, 15, 3, 12, 12.0, None, 0),
        ("(all)", 4, 2, 2, 0.5, 57, 29, 28, 8.5, 5.5, 1),
    ]


def test_unpaired_part_lengths(kto: Path) -> None:
    # (all) sorted: prompt [3,6,10,10], completion [2,5,9,12], total [8,15,15,19]; n = 4:
    # p50 the 2nd, p90 the 4th.
    got = keyed(run_query(kto, "part_lengths"), "split", "part")
    assert [k[1] for k in got if k[0] == "(all)"] == ["prompt", "completion", "total"]
    keys = ("rows", "tokens", "min", "p50", "p90", "max", "mean")
    assert tuple(got["(all)", "prompt"][k] for k in keys) == (4, 29, 3, 6, 10, 10, 7.25)
    assert tuple(got["(all)", "completion"][k] for k in keys) == (4, 28, 2, 5, 12, 12, 7.0)
    assert tuple(got["(all)", "total"][k] for k in keys) == (4, 57, 8, 15, 19, 19, 14.25)
    hist = rows(run_query(kto, "part_length_histogram", bin_width=5), "part", "bin_start", "rows")
    assert hist == [("prompt", 0, 1), ("prompt", 5, 1), ("prompt", 10, 2),
                    ("completion", 0, 1), ("completion", 5, 2), ("completion", 10, 1)]  # fmt: skip


def test_an_output_that_kept_no_pair(tmp_path: Path) -> None:
    counts = {"read": 2, "written": 0, "truncated": 0, "dropped": {"pair_too_long": 2}, "rejected": {}}
    dst = write_pair_dst(tmp_path / "empty", "preference", [], counts, None)
    results = run_queries(dst)
    assert list(results) == list(KINDS["preference"].queries)
    for name in ("part_length_histogram", "length_difference", "rejects", "packing"):
        assert results[name].num_rows == 0, name
    assert rows(results["pairs"], "split", "pairs", "tokens") == [("(all)", 0, 0)]
    assert rows(results["length_bias"], "pairs", "chosen_longer_share") == [(0, None)]
    assert ("dropped", "pair_too_long", 2) in rows(results["drops"], "stage", "reason", "manifest")


def test_the_kind_picks_the_queries(pref: Path, kto: Path, tmp_path: Path) -> None:
    assert list(run_queries(kto)) == list(KINDS["unpaired"].queries)
    assert query_names("preference") == list(KINDS["preference"].queries)
    assert "trained_share" not in KINDS["preference"].queries and "pairs" not in query_names()
    with pytest.raises(EtlError, match="unknown query 'lengths' for a preference output"):
        run_query(pref, "lengths")
    assert output_kind({}) == "sft" == output_kind({C.MANIFEST_KIND: "sft"})
    manifest = json.loads((pref / C.MANIFEST_FILE).read_text(encoding="utf-8"))
    with pytest.raises(EtlError, match="kind 'ranking' is not one this etl reads"):
        output_kind({**manifest, C.MANIFEST_KIND: "ranking"})


@settings(max_examples=25, deadline=None)
@given(
    diffs=st.lists(st.integers(-40, 40), min_size=1, max_size=30),
    width=st.integers(1, 12),
)
def test_length_difference_bins_count_every_pair_once(
    tmp_path_factory: pytest.TempPathFactory, diffs: list[int], width: int
) -> None:
    """Against a Python count: bins tile the range without overlap, 0 alone in [0, 1)."""
    import duckdb
    import pyarrow as pa
    import pyarrow.parquet as pq

    from etl.analysis.stats import load_query

    path = tmp_path_factory.mktemp("diff") / "part-00000.parquet"
    chosen = [50 + d for d in diffs]
    pq.write_table(pa.table({C.NUM_CHOSEN_TOKENS: chosen, C.NUM_REJECTED_TOKENS: [50] * len(diffs)}), path)
    sql = load_query("length_difference", "preference")
    got = duckdb.connect().sql(sql, params={"data": [str(path)], "bin_width": width}).fetchall()
    assert [n for _, _, n in got] == [sum(s <= d < e for d in diffs) for s, e, _ in got]
    assert sum(n for _, _, n in got) == len(diffs)
    assert all(e == s2 for (_, e, _), (s2, _, _) in itertools.pairwise(got))  # contiguous
    assert (0, 1) in {(s, e) for s, e, _ in got}
    assert all(e - s == width for s, e, _ in got if s != 0)
