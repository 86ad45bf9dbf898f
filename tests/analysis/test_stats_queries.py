"""Length, share, role, domain, turn and packing queries against independent recounts.

The recounts (tests/analysis/recount.py) read the Parquet back with pyarrow and count from the
lists themselves; `any_dst` runs each test on the hand-made fixture and on real `etl run` output.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.analysis.stats import default_bin_width, load_query, query_names, run_queries, run_query
from tests.analysis import test_mixture_stats, test_stats_checks
from tests.analysis.recount import by_split, examples, keyed, table
from tests.analysis.stats_fixtures import EXAMPLES, SEQ_LEN


def test_every_query_is_tested_here() -> None:
    names = [*globals(), *vars(test_stats_checks), *vars(test_mixture_stats)]
    tested = {name.removeprefix("test_") for name in names if name.startswith("test_")}
    assert set(query_names()) <= tested


def test_lengths(any_dst: Path) -> None:
    dst = any_dst
    got = keyed(run_query(dst, "lengths"), "split")
    lengths = by_split(examples(dst), "n")
    assert set(got) == set(lengths) and "(all)" in got
    for split, n in lengths.items():
        row = got[split]
        assert (row["examples"], row["tokens"], row["min"], row["max"]) == (
            len(n),
            n.sum(),
            n.min(),
            n.max(),
        )
        for q in (10, 50, 90, 95, 99):
            assert row[f"p{q}"] == np.percentile(n, q, method="inverted_cdf"), (split, q)
        assert row["mean"] == pytest.approx(n.mean(), abs=0.005)


def test_length_histogram(any_dst: Path) -> None:
    dst, width = any_dst, 16
    got = run_query(dst, "length_histogram", bin_width=width).to_pylist()
    lengths = by_split(examples(dst), "n")
    splits = set(lengths) - {"(all)"}
    edges = np.arange(0, lengths["(all)"].max() // width * width + 2 * width, width)
    for split in splits:
        rows = [r for r in got if r["split"] == split]
        counts, _ = np.histogram(lengths[split], bins=edges)
        assert [r["bin_start"] for r in rows] == edges[:-1].tolist()
        assert [r["bin_end"] - r["bin_start"] for r in rows] == [width] * len(rows)
        assert [r["examples"] for r in rows] == counts.tolist()
    assert {r["split"] for r in got} == splits


def test_length_histogram_default_bin_width(dst: Path) -> None:
    got = run_query(dst, "length_histogram").to_pylist()
    assert {r["bin_end"] - r["bin_start"] for r in got} == {default_bin_width(SEQ_LEN)} == {4}
    assert sum(r["examples"] for r in got) == len(EXAMPLES)


def test_trained_share(any_dst: Path) -> None:
    dst = any_dst
    got = keyed(run_query(dst, "trained_share"), "split")
    rows = examples(dst)
    n, t = by_split(rows, "n"), by_split(rows, "t")
    for split in n:
        row = got[split]
        assert row["tokens"] == n[split].sum()
        assert row["trained_tokens"] == row["trained_in_mask"] == t[split].sum()
        assert row["trained_share"] == pytest.approx(t[split].sum() / n[split].sum(), abs=5e-5)
        assert row["mean_example_share"] == pytest.approx((t[split] / n[split]).mean(), abs=5e-5)
        assert row["examples_untrained"] == int((t[split] == 0).sum())


def test_turns_per_example(any_dst: Path) -> None:
    """The query reports the data's own num_turns / num_turns_dropped (consistency checks them)."""
    rows = examples(any_dst)
    got = keyed(run_query(any_dst, "turns_per_example"), "split", "num_turns")
    expected = Counter((r["split"], r["num_turns"]) for r in rows)
    with_dropped = Counter((r["split"], r["num_turns"]) for r in rows if r["num_turns_dropped"])
    assert {k: v["examples"] for k, v in got.items()} == dict(expected)
    assert {
        k: v["examples_with_dropped_turns"]
        for k, v in got.items()
        if v["examples_with_dropped_turns"]
    } == dict(with_dropped)
    assert sum(v["turns_dropped"] for v in got.values()) == sum(
        r["num_turns_dropped"] for r in rows
    )
    for key, row in got.items():
        kept = [
            r["num_turns"] - r["num_turns_dropped"]
            for r in rows
            if (r["split"], r["num_turns"]) == key
        ]
        assert row["mean_kept_turns"] == pytest.approx(np.mean(kept), abs=0.005)


def test_roles(any_dst: Path) -> None:
    dst = any_dst
    got = keyed(run_query(dst, "roles"), "role")
    masks = {r["id"]: r["loss_mask"] for r in examples(dst)}
    expected: dict[str, Counter] = defaultdict(Counter)
    for t in table(dst, "turns").to_pylist():
        e = expected[t["role"]]
        e["turns"] += 1
        if t["kept"]:
            e["kept_turns"] += 1
            e["trained_turns"] += t["trained"]
            e["kept_tokens"] += t["end"] - t["start"]
            e["trained_tokens"] += sum(masks[t["id"]][t["start"] : t["end"]])
        else:
            e["dropped_turns"] += 1
            e["dropped_tokens"] += t["num_tokens"]
    assert set(got) == set(expected) and {"system", "user", "assistant"} <= set(got)
    for role, e in expected.items():
        for column in (
            "turns",
            "kept_turns",
            "dropped_turns",
            "trained_turns",
            "kept_tokens",
            "dropped_tokens",
            "trained_tokens",
        ):
            assert got[role][column] == e[column], (role, column)
    # Both outputs train assistant turns only: every trained token lies in one.
    assert got["assistant"]["trained_tokens"] == sum(r["t"] for r in examples(dst))


def test_domains(any_dst: Path) -> None:
    dst = any_dst
    got = keyed(run_query(dst, "domains"), "domain", "split")
    expected: dict[tuple, Counter] = defaultdict(Counter)
    for r in examples(dst):
        e = expected[(r["domain"], r["split"])]
        e["examples"] += 1
        e["tokens"] += r["n"]
        e["trained_tokens"] += r["t"]
        e["truncated"] += r["truncated"]
        e["turns_dropped"] += r["num_turns_dropped"]
    assert set(got) == set(expected)
    for key, e in expected.items():
        assert {c: got[key][c] for c in e} == dict(e) | {c: 0 for c in e if not e[c]}
        assert got[key]["mean_tokens"] == pytest.approx(e["tokens"] / e["examples"], abs=0.005)


def ffd(lengths: list[int], size: int) -> int:
    """First-fit decreasing, the packer the lower bound is compared with."""
    free: list[int] = []
    for n in sorted((min(x, size) for x in lengths), reverse=True):
        for i, room in enumerate(free):
            if room >= n:
                free[i] -= n
                break
        else:
            free.append(size - n)
    return len(free)


def test_packing(any_dst: Path) -> None:
    dst = any_dst
    got = keyed(run_query(dst, "packing", seq_lens=[64, 100, 128, 512]), "split", "seq_len")
    lengths = by_split(examples(dst), "n")
    for split in set(lengths) - {"(all)"}:
        n = lengths[split]
        for size in (64, 100, 128, 512):
            row = got[(split, size)]
            kept = np.minimum(n, size)
            bound = max(math.ceil(kept.sum() / size), int((n * 2 > size).sum()))
            assert row["padded_sequences"] == row["examples"] == len(n)
            assert row["longer_than_seq_len"] == int((n > size).sum())
            assert row["stream_sequences"] == math.ceil(n.sum() / size)
            assert row["packed_lower_bound"] == bound <= ffd(n.tolist(), size)
            assert row["padded_fill"] == pytest.approx(kept.sum() / (len(n) * size), abs=5e-5)
            assert row["packed_fill"] == pytest.approx(kept.sum() / (bound * size), abs=5e-5)


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=40), size=st.integers(8, 256))
def test_packing_matches_numpy_on_random_lengths(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[int], size: int
) -> None:
    import duckdb
    import pyarrow.parquet as pq

    path = tmp_path_factory.mktemp("packing") / "part-00000.parquet"
    pq.write_table(
        pa.table({"split": ["train"] * len(lengths), "num_tokens": pa.array(lengths, pa.int32())}),
        path,
    )
    params = {"data": [str(path)], "seq_lens": [size]}
    row = duckdb.connect().sql(load_query("packing"), params=params).to_arrow_table().to_pylist()[0]
    n = np.asarray(lengths)
    bound = max(math.ceil(np.minimum(n, size).sum() / size), int((2 * n > size).sum()))
    assert (row["stream_sequences"], row["packed_lower_bound"]) == (
        math.ceil(n.sum() / size),
        bound,
    )
    assert row["packed_lower_bound"] <= ffd(lengths, size) <= row["padded_sequences"]


def test_queries_on_an_empty_output(empty_dst: Path) -> None:
    results = run_queries(empty_dst)
    assert set(results) == set(query_names())
    assert results["lengths"].to_pylist()[0]["examples"] == 0
    for name in (
        "length_histogram",
        "roles",
        "domains",
        "packing",
        "zero_trained",
        "untrained_eot",
        "rejects",
        "turns_per_example",
        "packs",
    ):
        assert results[name].num_rows == 0, name


@pytest.mark.parametrize("strategy, seq_len", [("bfd", 64), ("sequential", 40), ("stream", 48)])
def test_packs(any_dst: Path, tmp_path: Path, strategy: str, seq_len: int) -> None:
    """Read back from the index `etl pack` wrote, against counts made from the index itself."""
    import shutil

    from etl.cli import main
    from etl.packing.index_io import read_pack_index

    assert run_query(any_dst, "packs").num_rows == 0  # no index yet: no rows, no error
    dst = tmp_path / "dst"
    shutil.copytree(any_dst, dst)
    assert main(["pack", str(dst), "--strategy", strategy, "--seq-len", str(seq_len)]) == 0
    got = keyed(run_query(dst, "packs"), "split")
    lengths = by_split(examples(dst), "n")  # recounted from input_ids
    assert set(got) == set(lengths) - {"(all)"}
    for split, row in got.items():
        index = read_pack_index(dst, split)
        assert index is not None
        p = index.packing
        docs = [len(set(p.doc[p.pack == k].tolist())) for k in range(p.num_packs)]
        tokens = int(p.length.sum())
        n = lengths[split]
        held = [np.zeros(k, dtype=bool) for k in n]  # token by token: which a piece holds
        for doc, start, length in zip(p.doc, p.start, p.length, strict=True):
            held[doc][start:start + length] = True
        skipped = int(sum((~h).sum() for h in held))
        assert row == {
            "split": split, "strategy": strategy, "seq_len": seq_len, "packs": p.num_packs,
            "examples": len(set(p.doc.tolist())), "pieces": len(p), "tokens": tokens,
            "utilization": round(tokens / (p.num_packs * seq_len), 6),
            "mean_docs": round(sum(docs) / len(docs), 2), "min_docs": min(docs), "max_docs": max(docs),
            "clipped": index.clipped, "skipped_tokens": skipped,
            "stream_utilization": round(1 - skipped / int(n.sum()), 6),
        }
        assert row["examples"] == len(lengths[split])
        if strategy != "stream":  # bfd loses the clipped tails, sequential nothing
            assert skipped == (int(np.maximum(n - seq_len, 0).sum()) if strategy == "bfd" else 0)
        if strategy != "stream":  # stream adds injected pieces and may skip a dangling tail
            assert tokens == int(np.minimum(n, seq_len).sum() if strategy == "bfd" else n.sum())
