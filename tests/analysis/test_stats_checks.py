"""Drops, rejects, consistency and suspicious-row queries against independent recounts."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.analysis.stats import run_query
from tests.analysis.recount import examples, keyed, table
from tests.analysis.stats_fixtures import EOT, SEP
from tests.helpers import seal, write_manifest


def test_drops(any_dst: Path) -> None:
    dst = any_dst
    got = keyed(run_query(dst, "drops"), "stage", "reason")
    counts = json.loads((dst / "_manifest.json").read_text())["counts"]
    rows = examples(dst)
    rejects = Counter(table(dst, "_rejects").column("reason").to_pylist())
    assert got[("read", None)]["manifest"] == counts["read"]
    assert (got[("written", None)]["manifest"], got[("written", None)]["observed"]) == (
        counts["written"],
        len(rows),
    )
    assert (
        got[("truncated", None)]["observed"]
        == sum(r["truncated"] for r in rows)
        == counts["truncated"]
    )
    assert got[("turns_dropped", None)]["observed"] == sum(r["num_turns_dropped"] for r in rows)
    for reason, n in counts["dropped"].items():
        assert got[("dropped", reason)]["manifest"] == n
        assert got[("dropped", reason)]["share_of_read"] == pytest.approx(
            n / counts["read"], abs=5e-5
        )
    rejected = {k: v for (stage, k), v in got.items() if stage == "rejected"}
    assert set(rejected) == set(counts["rejected"]) | set(rejects)
    for reason, row in rejected.items():
        assert row["manifest"] == counts["rejected"].get(reason), reason
        assert row["observed"] == (rejects[reason] or None), reason
    gap = (
        counts["read"]
        - counts["written"]
        - sum(counts["dropped"].values())
        - sum(counts["rejected"].values())
    )
    assert got[("accounting_gap", None)]["manifest"] == gap == 0


def test_drops_shows_both_sides_of_a_mismatch(dst: Path) -> None:
    got = keyed(run_query(dst, "drops"), "stage", "reason")
    assert (
        got[("rejected", "bad_role")]["manifest"],
        got[("rejected", "bad_role")]["observed"],
    ) == (1, None)
    assert (
        got[("rejected", "encoding")]["manifest"],
        got[("rejected", "encoding")]["observed"],
    ) == (None, 1)


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
        mine = sorted(
            (r["source_file"], r["source_line"], r["detail"]) for r in rows if r["reason"] == reason
        )
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
    all_turns, dropped = (
        Counter(t["id"] for t in turns),
        Counter(t["id"] for t in turns if not t["kept"]),
    )

    def untrained_but_masked(t: dict) -> bool:
        return (
            t["kept"]
            and not t["trained"]
            and any(by_id[t["id"]]["loss_mask"][t["start"] : t["end"]])
        )

    checks = {
        "num_tokens = len(input_ids)": [r["id"] for r in data if r["num_tokens"] != r["n"]],
        "len(loss_mask) = len(input_ids)": [r["id"] for r in data if len(r["loss_mask"]) != r["n"]],
        "num_trained = trained tokens in loss_mask": [
            r["id"] for r in data if r["num_trained"] != r["t"]
        ],
        "num_tokens <= seq_len": [r["id"] for r in data if r["n"] > seq_len],
        "example has turns rows": [r["id"] for r in data if not all_turns[r["id"]]],
        "num_turns = turns rows (kept or not)": [
            r["id"] for r in data if r["num_turns"] != all_turns[r["id"]]
        ],
        "num_turns_dropped = dropped turns": [
            r["id"] for r in data if r["num_turns_dropped"] != dropped[r["id"]]
        ],
        "turn belongs to an example": [t["id"] for t in turns if t["id"] not in by_id],
        "kept turn inside [0, num_tokens)": [
            t["id"]
            for t in turns
            if t["kept"]
            and t["id"] in by_id
            and not 0 <= t["start"] <= t["end"] <= by_id[t["id"]]["n"]
        ],
        "dropped turn has start = end = -1": [
            t["id"] for t in turns if not t["kept"] and (t["start"], t["end"]) != (-1, -1)
        ],
        "untrained turn has no trained token": [
            t["id"] for t in turns if t["id"] in by_id and untrained_but_masked(t)
        ],
    }
    return {rule: (len(ids), min(ids) if ids else None) for rule, ids in checks.items()}


def test_consistency(any_dst: Path) -> None:
    got = {
        r["rule"]: (r["violations"], r["first_id"])
        for r in run_query(any_dst, "consistency").to_pylist()
    }
    assert got == consistency_violations(any_dst)


def test_consistency_finds_broken_outputs(dst: Path, tmp_path: Path) -> None:

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
    seal(broken)  # as if etl had written these broken parts (readers refuse parts edited after)
    expected = consistency_violations(broken)
    # 6 rules broken: num_tokens <= seq_len cannot be, readers refuse such an output (tests/output/test_verify.py)
    assert sum(n for n, _ in expected.values()) >= 6
    got = {
        r["rule"]: (r["violations"], r["first_id"])
        for r in run_query(broken, "consistency").to_pylist()
    }
    assert got == expected


def test_zero_trained(any_dst: Path) -> None:
    got = run_query(any_dst, "zero_trained").to_pylist()
    assert sorted(r["id"] for r in got) == sorted(r["id"] for r in examples(any_dst) if r["t"] == 0)
    assert all(r["mask_trained"] == 0 for r in got)


def test_zero_trained_fixture_and_real(dst: Path, real_dst: Path) -> None:
    assert [r["id"] for r in run_query(dst, "zero_trained").to_pylist()] == ["ex-code-2"]
    assert run_query(real_dst, "zero_trained").num_rows == 0  # etl run drops them


def _untrained_eots(dst: Path, end_id: int) -> list[tuple[str, int, bool, int | None]]:
    """Python version of the documented rule: the last end_id in [start, end) must be trained."""
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

    copy = Path(shutil.copytree(dst, tmp_path / "dst"))
    manifest = json.loads((copy / "_manifest.json").read_text())
    edit(manifest)
    return write_manifest(copy, manifest)  # sealed: an edit etl's readers accept


def test_untrained_eot(any_dst: Path) -> None:
    manifest = json.loads((any_dst / "_manifest.json").read_text())
    end_id = manifest["template"]["roles"]["assistant"]["end_ids"][-1]
    assert _rows(run_query(any_dst, "untrained_eot")) == _untrained_eots(any_dst, end_id)


def test_untrained_eot_fixture(dst: Path) -> None:
    got = _rows(run_query(dst, "untrained_eot"))
    assert got == _untrained_eots(dst, EOT)
    assert [g[:3] for g in got] == [("ex-chat-1", 2, True)]
    turn = next(
        t for t in table(dst, "turns").to_pylist() if (t["id"], t["turn_index"]) == got[0][:2]
    )
    assert got[0][3] == turn["end"] - 1 - len(SEP)


def test_untrained_eot_falls_back_to_eot_id(dst: Path, tmp_path: Path) -> None:
    copy = _with_manifest(dst, tmp_path, lambda m: m["template"].pop("roles"))
    assert _rows(run_query(copy, "untrained_eot")) == _untrained_eots(dst, EOT)


def test_untrained_eot_uses_the_roles_end_token(dst: Path, tmp_path: Path) -> None:
    """An assistant end token of "\n" (id 10): found on the untrained separator, or missing."""
    copy = _with_manifest(
        dst, tmp_path, lambda m: m["template"]["roles"]["assistant"].update(end_ids=[10])
    )
    got = _rows(run_query(copy, "untrained_eot"))
    assert got == _untrained_eots(copy, 10)
    assert len(got) == 8 and ("ex-math-3", 2, False, None) in got
