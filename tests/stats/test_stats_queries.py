"""Every sql/ query against the same figure computed independently with pyarrow/numpy/Python.

The independent side reads the Parquet back and recounts from the lists themselves
(input_ids lengths, loss_mask values), not from the num_* columns the queries may use.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.stats import default_bin_width, load_query, query_names, run_queries, run_query
from tests.stats.stats_fixtures import EOT, EXAMPLES, SEP, SEQ_LEN


def table(dst: Path, folder: str) -> pa.Table:
    return ds.dataset(str(dst / folder), format="parquet").to_table()


def examples(dst: Path) -> list[dict]:
    """Data rows with the lengths and trained counts recounted from the lists."""
    rows = table(dst, "data").to_pylist()
    for r in rows:
        r["n"] = len(r["input_ids"])
        r["t"] = int(np.sum(np.asarray(r["loss_mask"], dtype=bool)))
    return rows


def by_split(rows: list[dict], key: str) -> dict[str, np.ndarray]:
    out: dict[str, list] = defaultdict(list)
    for r in rows:
        out[r["split"]].append(r[key])
        out["(all)"].append(r[key])
    return {k: np.asarray(v) for k, v in out.items()}


def keyed(result: pa.Table, *keys: str) -> dict:
    return {tuple(r[k] for k in keys) if len(keys) > 1 else r[keys[0]]: r for r in result.to_pylist()}


def test_every_query_is_tested_here() -> None:
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    assert set(query_names()) <= tested


def test_lengths(any_dst: Path) -> None:
    dst = any_dst
    got = keyed(run_query(dst, "lengths"), "split")
    lengths = by_split(examples(dst), "n")
    assert set(got) == set(lengths) and "(all)" in got
    for split, n in lengths.items():
        row = got[split]
        assert (row["examples"], row["tokens"], row["min"], row["max"]) == (len(n), n.sum(), n.min(), n.max())
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
    assert {k: v["examples_with_dropped_turns"] for k, v in got.items() if v["examples_with_dropped_turns"]} \
        == dict(with_dropped)
    assert sum(v["turns_dropped"] for v in got.values()) == sum(r["num_turns_dropped"] for r in rows)
    for key, row in got.items():
        kept = [r["num_turns"] - r["num_turns_dropped"] for r in rows if (r["split"], r["num_turns"]) == key]
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
            e["trained_tokens"] += sum(masks[t["id"]][t["start"]:t["end"]])
        else:
            e["dropped_turns"] += 1
            e["dropped_tokens"] += t["num_tokens"]
    assert set(got) == set(expected) and {"system", "user", "assistant"} <= set(got)
    for role, e in expected.items():
        for column in ("turns", "kept_turns", "dropped_turns", "trained_turns", "kept_tokens",
                       "dropped_tokens", "trained_tokens"):
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


def test_drops(any_dst: Path) -> None:
    dst = any_dst
    got = keyed(run_query(dst, "drops"), "stage", "reason")
    counts = json.loads((dst / "_manifest.json").read_text())["counts"]
    rows = examples(dst)
    rejects = Counter(table(dst, "_rejects").column("reason").to_pylist())
    assert got[("read", None)]["manifest"] == counts["read"]
    assert (got[("written", None)]["manifest"], got[("written", None)]["observed"]) == (counts["written"], len(rows))
    assert got[("truncated", None)]["observed"] == sum(r["truncated"] for r in rows) == counts["truncated"]
    assert got[("turns_dropped", None)]["observed"] == sum(r["num_turns_dropped"] for r in rows)
    for reason, n in counts["dropped"].items():
        assert got[("dropped", reason)]["manifest"] == n
        assert got[("dropped", reason)]["share_of_read"] == pytest.approx(n / counts["read"], abs=5e-5)
    rejected = {k: v for (stage, k), v in got.items() if stage == "rejected"}
    assert set(rejected) == set(counts["rejected"]) | set(rejects)
    for reason, row in rejected.items():
        assert row["manifest"] == counts["rejected"].get(reason), reason
        assert row["observed"] == (rejects[reason] or None), reason
    gap = counts["read"] - counts["written"] - sum(counts["dropped"].values()) - sum(counts["rejected"].values())
    assert got[("accounting_gap", None)]["manifest"] == gap == 0


def test_drops_shows_both_sides_of_a_mismatch(dst: Path) -> None:
    got = keyed(run_query(dst, "drops"), "stage", "reason")
    assert (got[("rejected", "bad_role")]["manifest"], got[("rejected", "bad_role")]["observed"]) == (1, None)
    assert (got[("rejected", "encoding")]["manifest"], got[("rejected", "encoding")]["observed"]) == (None, 1)


def test_drops_reports_gap_and_missing_rejects(empty_dst: Path) -> None:
    got = keyed(run_query(empty_dst, "drops"), "stage", "reason")
    assert got[("written", None)]["observed"] == 0
    assert got[("dropped", "too_long")]["manifest"] == 2
    assert got[("accounting_gap", None)]["manifest"] == 0
    assert not any(stage == "rejected" for stage, _ in got)


def test_rejects(any_dst: Path) -> None:
    dst = any_dst
    got = keyed(run_query(dst, "rejects"), "reason")
    rows = table(dst, "_rejects").to_pylist()
    for reason, n in Counter(r["reason"] for r in rows).items():
        mine = sorted((r["source_file"], r["source_line"], r["detail"]) for r in rows if r["reason"] == reason)
        assert got[reason]["rejects"] == n
        assert got[reason]["files"] == len({m[0] for m in mine})
        assert got[reason]["first_at"] == f"{mine[0][0]}:{mine[0][1]}"
        assert got[reason]["first_detail"] == mine[0][2]
    counts = [r["rejects"] for r in run_query(dst, "rejects").to_pylist()]
    assert counts == sorted(counts, reverse=True)  # most frequent first


def consistency_violations(dst: Path) -> dict[str, tuple[int, str | None]]:
    """Python version of every rule of consistency.sql: rule -> (violations, smallest id)."""
    data = examples(dst)
    seq_len = json.loads((dst / "_manifest.json").read_text())["seq_len"]
    turns = table(dst, "turns").to_pylist()
    by_id = {r["id"]: r for r in data}
    all_turns, dropped = Counter(t["id"] for t in turns), Counter(t["id"] for t in turns if not t["kept"])

    def untrained_but_masked(t: dict) -> bool:
        return t["kept"] and not t["trained"] and any(by_id[t["id"]]["loss_mask"][t["start"]:t["end"]])

    checks = {
        "num_tokens = len(input_ids)": [r["id"] for r in data if r["num_tokens"] != r["n"]],
        "len(loss_mask) = len(input_ids)": [r["id"] for r in data if len(r["loss_mask"]) != r["n"]],
        "num_trained = trained tokens in loss_mask": [r["id"] for r in data if r["num_trained"] != r["t"]],
        "num_tokens <= seq_len": [r["id"] for r in data if r["n"] > seq_len],
        "example has turns rows": [r["id"] for r in data if not all_turns[r["id"]]],
        "num_turns = turns rows (kept or not)": [r["id"] for r in data if r["num_turns"] != all_turns[r["id"]]],
        "num_turns_dropped = dropped turns": [r["id"] for r in data if r["num_turns_dropped"] != dropped[r["id"]]],
        "turn belongs to an example": [t["id"] for t in turns if t["id"] not in by_id],
        "kept turn inside [0, num_tokens)": [
            t["id"] for t in turns if t["kept"] and t["id"] in by_id
            and not 0 <= t["start"] <= t["end"] <= by_id[t["id"]]["n"]],
        "dropped turn has start = end = -1": [
            t["id"] for t in turns if not t["kept"] and (t["start"], t["end"]) != (-1, -1)],
        "untrained turn has no trained token": [
            t["id"] for t in turns if t["id"] in by_id and untrained_but_masked(t)],
    }
    return {rule: (len(ids), min(ids) if ids else None) for rule, ids in checks.items()}


def test_consistency(any_dst: Path) -> None:
    got = {r["rule"]: (r["violations"], r["first_id"]) for r in run_query(any_dst, "consistency").to_pylist()}
    assert got == consistency_violations(any_dst)


def test_consistency_finds_broken_outputs(dst: Path, tmp_path: Path) -> None:
    import shutil

    import pyarrow.parquet as pq

    broken = Path(shutil.copytree(dst, tmp_path / "broken"))
    part = broken / "data" / "train" / "part-00000.parquet"
    rows = pq.read_table(part).to_pylist()
    rows[0]["num_trained"] += 1
    rows[1]["num_turns"] += 1
    pq.write_table(pa.Table.from_pylist(rows, pq.read_schema(part)), part)
    part = broken / "turns" / "train" / "part-00000.parquet"
    turns = pq.read_table(part).to_pylist()
    turns[0]["end"] = 10_000
    next(t for t in turns if not t["kept"])["start"] = 0
    next(t for t in turns if t["kept"] and t["role"] == "user")["trained"] = False
    turns[4]["trained"] = False  # an assistant turn whose tokens are trained
    turns.append({**turns[1], "id": "ghost"})
    pq.write_table(pa.Table.from_pylist(turns, pq.read_schema(part)), part)
    expected = consistency_violations(broken)
    assert sum(n for n, _ in expected.values()) >= 7
    got = {r["rule"]: (r["violations"], r["first_id"]) for r in run_query(broken, "consistency").to_pylist()}
    assert got == expected


def test_zero_trained(any_dst: Path) -> None:
    got = run_query(any_dst, "zero_trained").to_pylist()
    assert sorted(r["id"] for r in got) == sorted(r["id"] for r in examples(any_dst) if r["t"] == 0)
    assert all(r["mask_trained"] == 0 for r in got)


def test_zero_trained_fixture_and_real(dst: Path, real_dst: Path) -> None:
    assert [r["id"] for r in run_query(dst, "zero_trained").to_pylist()] == ["ex-code-2"]
    assert run_query(real_dst, "zero_trained").num_rows == 0  # etl run drops them


def _untrained_eots(dst: Path, end_id: int) -> list[tuple[str, int, bool, int | None]]:
    """Python version of the documented rule: the last end_id inside [start, end) must be trained."""
    data = {r["id"]: r for r in examples(dst)}
    out = []
    for t in table(dst, "turns").to_pylist():
        if t["role"] == "assistant" and t["kept"] and t["trained"]:
            ids = data[t["id"]]["input_ids"]
            hits = [p for p in range(t["start"], t["end"]) if ids[p] == end_id]
            if not hits or not data[t["id"]]["loss_mask"][hits[-1]]:
                out.append((t["id"], t["turn_index"], bool(hits), hits[-1] if hits else None))
    return sorted(out)


def _rows(result: pa.Table) -> list[tuple[str, int, bool, int | None]]:
    rows = result.to_pylist()
    assert [(r["split"], r["id"]) for r in rows] == sorted((r["split"], r["id"]) for r in rows)
    return sorted((r["id"], r["turn_index"], r["has_eot"], r["eot_pos"]) for r in rows)


def _with_manifest(dst: Path, tmp_path: Path, edit) -> Path:
    import shutil

    copy = Path(shutil.copytree(dst, tmp_path / "dst"))
    manifest = json.loads((copy / "_manifest.json").read_text())
    edit(manifest)
    (copy / "_manifest.json").write_text(json.dumps(manifest))
    return copy


def test_untrained_eot(any_dst: Path) -> None:
    manifest = json.loads((any_dst / "_manifest.json").read_text())
    end_id = manifest["template"]["roles"]["assistant"]["end_ids"][-1]
    assert _rows(run_query(any_dst, "untrained_eot")) == _untrained_eots(any_dst, end_id)


def test_untrained_eot_fixture(dst: Path) -> None:
    got = _rows(run_query(dst, "untrained_eot"))
    assert got == _untrained_eots(dst, EOT)
    assert [g[:3] for g in got] == [("ex-chat-1", 2, True)]
    turn = next(t for t in table(dst, "turns").to_pylist() if (t["id"], t["turn_index"]) == got[0][:2])
    assert got[0][3] == turn["end"] - 1 - len(SEP)


def test_untrained_eot_falls_back_to_eot_id(dst: Path, tmp_path: Path) -> None:
    copy = _with_manifest(dst, tmp_path, lambda m: m["template"].pop("roles"))
    assert _rows(run_query(copy, "untrained_eot")) == _untrained_eots(dst, EOT)


def test_untrained_eot_uses_the_roles_end_token(dst: Path, tmp_path: Path) -> None:
    """An assistant end token of "\n" (id 10): found on the untrained separator, or missing."""
    copy = _with_manifest(dst, tmp_path, lambda m: m["template"]["roles"]["assistant"].update(end_ids=[10]))
    got = _rows(run_query(copy, "untrained_eot"))
    assert got == _untrained_eots(copy, 10)
    assert len(got) == 8 and ("ex-math-3", 2, False, None) in got


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
def test_packing_matches_numpy_on_random_lengths(tmp_path_factory: pytest.TempPathFactory,
                                                 lengths: list[int], size: int) -> None:
    import duckdb
    import pyarrow.parquet as pq

    path = tmp_path_factory.mktemp("packing") / "part-00000.parquet"
    pq.write_table(pa.table({"split": ["train"] * len(lengths), "num_tokens": pa.array(lengths, pa.int32())}), path)
    params = {"data": [str(path)], "seq_lens": [size]}
    row = duckdb.connect().sql(load_query("packing"), params=params).to_arrow_table().to_pylist()[0]
    n = np.asarray(lengths)
    bound = max(math.ceil(np.minimum(n, size).sum() / size), int((2 * n > size).sum()))
    assert (row["stream_sequences"], row["packed_lower_bound"]) == (math.ceil(n.sum() / size), bound)
    assert row["packed_lower_bound"] <= ffd(lengths, size) <= row["padded_sequences"]


def test_queries_on_an_empty_output(empty_dst: Path) -> None:
    results = run_queries(empty_dst)
    assert set(results) == set(query_names())
    assert results["lengths"].to_pylist()[0]["examples"] == 0
    for name in ("length_histogram", "roles", "domains", "packing", "zero_trained", "untrained_eot",
                 "rejects", "turns_per_example"):
        assert results[name].num_rows == 0, name
