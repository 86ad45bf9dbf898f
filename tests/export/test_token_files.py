"""The bin/h5 export: `etl.export.token_files` bin / h5 files, sharding, `read_bin`, and the CLI."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl import columns as c
from etl.cli import main
from etl.errors import EtlError
from etl.export.token_files import domain_folder, read_bin, read_meta, write_bin, write_h5
from etl.output.parquet import DATA_SCHEMA
from tests.helpers import seal

REPO = Path(__file__).resolve().parents[2]
PLAIN = ["loss_mask.bin", "meta.json", "offsets.bin", "sequence.bin"]  # one shard: plain names
F, T = False, True
# (domain, ids, mask) in Parquet row order; wiki and code interleave across files and row groups.
ROWS: list[tuple[str | None, list[int], list[bool]]] = [
    ("wiki", [1, 2, 3], [F, T, T]),
    ("code", [100, 101], [F, T]),
    ("wiki", [4, 5], [F, T]),
    ("wiki", [6, 7, 8, 9], [F, F, T, T]),
    ("wiki", [10], [T]),
    ("code", [102, 103, 104], [F, T, T]),
    ("wiki", list(range(11, 20)), [F] * 4 + [T] * 5),  # 9 tokens: longer than a 5-token shard
    ("wiki", [20, 21], [F, T]),
]


def _table(rows: list[tuple[str | None, list[int], list[bool]]], **extra: Any) -> pa.Table:
    n = len(rows)
    cols = {
        c.ID: [f"r{i}" for i in range(n)],
        c.SOURCE_FILE: ["f.jsonl"] * n,
        c.SOURCE_LINE: list(range(n)),
        c.DOMAIN: [d for d, _, _ in rows],
        c.SPLIT: ["train"] * n,
        c.INPUT_IDS: [ids for _, ids, _ in rows],
        c.LOSS_MASK: [m for _, _, m in rows],
        c.NUM_TOKENS: [len(ids) for _, ids, _ in rows],
        c.NUM_TRAINED: [sum(m) for _, _, m in rows],
        c.NUM_TURNS: [2] * n,
        c.NUM_TURNS_DROPPED: [0] * n,
        c.TRUNCATED: [False] * n,
        c.ASSISTANT_MASKS: [m for _, _, m in rows],
    }
    table = pa.Table.from_pydict(cols, schema=DATA_SCHEMA)
    for name, values in extra.items():
        table = table.append_column(name, values)
    return table


def make_dst(root: Path, rows: list = ROWS, **extra: Any) -> Path:
    """Two part files of row groups of 2 rows, plus a manifest: an `etl run`-shaped DST."""
    half = len(rows) // 2
    for k, part in enumerate((rows[:half], rows[half:])):
        cols = {name: values[k * half : k * half + len(part)] for name, values in extra.items()}
        path = root / c.DATA_DIR / "train" / f"part-{k:05d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(_table(part, **cols), path, row_group_size=2)
    return seal(root, {"pad_id": 0, "eot_id": 99, "seq_len": 16, "tokenizer": {"name": "b"}})


def expected(domain: str) -> list[tuple[list[int], list[bool]]]:
    return [(ids, m) for d, ids, m in ROWS if d == domain]


def sequences(seq: Any, mask: Any, offsets: np.ndarray) -> list[tuple[list[int], list[bool]]]:
    return [
        (seq[a:b].tolist(), np.asarray(mask[a:b]).astype(bool).tolist())
        for a, b in itertools.pairwise(offsets)
    ]


@pytest.fixture
def dst(tmp_path: Path) -> Path:
    return make_dst(tmp_path / "dst")


def test_bin_round_trips_tokens_masks_and_offsets(dst: Path, tmp_path: Path) -> None:
    counts = write_bin(dst, tmp_path / "out")
    assert counts == {
        "wiki": {"sequences": 6, "tokens": 21, "trained": 12, "shards": 1},
        "code": {"sequences": 2, "tokens": 5, "trained": 3, "shards": 1},
    }
    for domain in ("wiki", "code"):
        d = tmp_path / "out" / domain
        assert sorted(p.name for p in d.iterdir()) == PLAIN
        seq, mask, offsets = read_bin(d)
        assert isinstance(seq, np.memmap) and seq.dtype == np.dtype("<i8")
        assert sequences(seq, mask, offsets) == expected(domain)
        # The plain reading: raw little-endian int64, shape from meta.json.
        meta = read_meta(d)
        raw = np.memmap(
            d / "sequence.bin", dtype="<i8", mode="r", shape=tuple(meta["sequence"]["shape"])
        )
        assert raw.tolist() == [t for ids, _ in expected(domain) for t in ids]
        assert np.fromfile(d / "loss_mask.bin", "<i8").tolist() == [
            int(b) for _, m in expected(domain) for b in m
        ]
    meta = read_meta(tmp_path / "out" / "code")
    assert meta["sequence"] == {"shape": [5], "dtype": "int64", "byteorder": "little"}
    assert meta["loss_mask"] == meta["sequence"]
    assert meta["offsets"]["shape"] == [3]
    assert (meta["format"], meta["domain"], meta["split"], meta["num_trained"]) == (
        "bin",
        "code",
        "train",
        3,
    )
    assert meta["shards"] == [
        {
            "files": {
                "sequence": "sequence.bin",
                "loss_mask": "loss_mask.bin",
                "offsets": "offsets.bin",
            },
            "num_sequences": 2,
            "num_tokens": 5,
            "num_trained": 3,
            "first_sequence": 0,
            "first_token": 0,
        }
    ]
    assert meta["source"]["eot_id"] == 99 and meta["source"]["dst"] == str(dst.resolve())


def test_bin_shards_at_the_limit_and_never_splits_a_sequence(dst: Path, tmp_path: Path) -> None:
    # wiki lengths 3 2 4 1 9 2, limit 5: [3 2] [4 1] [9] (alone, over the limit) [2].
    write_bin(dst, tmp_path / "out", max_tokens_per_shard=5)
    d = tmp_path / "out" / "wiki"
    meta = read_meta(d)
    shards = meta["shards"]
    assert [(s["num_sequences"], s["num_tokens"]) for s in shards] == [
        (2, 5),
        (2, 5),
        (1, 9),
        (1, 2),
    ]
    assert [s["first_sequence"] for s in shards] == [0, 2, 4, 5]
    assert [s["first_token"] for s in shards] == [0, 5, 10, 19]
    assert shards[2]["files"]["sequence"] == "sequence-00002.bin"
    got = []
    for k in range(len(shards)):
        got += sequences(*read_bin(d, shard=k))
    assert got == expected("wiki")
    assert len(read_meta(tmp_path / "out" / "code")["shards"]) == 1  # 5 tokens fit exactly
    with pytest.raises(EtlError, match="4 shards; pass shard="):
        read_bin(d)
    # Re-exporting into the same folder with one shard leaves no stale shard files behind.
    write_bin(dst, tmp_path / "out")
    assert sorted(p.name for p in d.iterdir()) == PLAIN


def test_h5_round_trips_with_chunked_compressed_datasets(dst: Path, tmp_path: Path) -> None:
    counts = write_h5(dst, tmp_path / "out", max_tokens_per_shard=5)
    assert counts["wiki"]["shards"] == 4 and counts["code"]["shards"] == 1
    meta = read_meta(tmp_path / "out" / "wiki")
    assert meta["format"] == "h5" and meta["num_tokens"] == 21
    got = []
    for shard in meta["shards"]:
        with h5py.File(tmp_path / "out" / "wiki" / shard["files"]["data"], "r") as f:
            for name in ("sequence", "loss_mask", "offsets"):
                assert (
                    f[name].dtype == np.int64 and f[name].chunks and f[name].compression == "gzip"
                )
            assert f["sequence"].shape == (shard["num_tokens"],)
            got += sequences(f["sequence"][:], f["loss_mask"][:], f["offsets"][:])
    assert got == expected("wiki")
    with h5py.File(tmp_path / "out" / "code" / "data.h5", "r") as f:
        assert sequences(f["sequence"][:], f["loss_mask"][:], f["offsets"][:]) == expected("code")


def test_out_is_dst_with_awkward_domains_and_weights(tmp_path: Path) -> None:
    rows = [(None, [1, 2], [F, T]), ("", [3], [T]), ("data", [4], [T]), ("a/b", [5], [T])]
    weights = pa.array([[1.0, 2.0], [0.5], [1.0], [3.0]], pa.list_(pa.float32()))
    dst = make_dst(tmp_path / "dst", rows, **{c.LOSS_WEIGHT: weights})
    counts = write_bin(dst, dst)  # OUT = DST: the bin files next to the run's Parquet
    assert sorted(counts) == ["__default__", "a/b", "data"]
    assert sorted(p.name for p in dst.iterdir()) == [
        "%64ata",
        "__default__",
        "_export.json",
        "_manifest.json",
        "a%2Fb",
        c.DATA_DIR,
    ]
    assert (domain_folder("data"), domain_folder(".."), domain_folder("x%y")) == (
        "%64ata",
        "%2E.",
        "x%25y",
    )
    d = dst / "__default__"
    assert np.fromfile(d / "loss_weight.bin", "<f4").tolist() == [1.0, 2.0, 0.5]
    assert read_meta(d)[c.LOSS_WEIGHT]["dtype"] == "float32"
    assert read_meta(dst / "%64ata")["domain"] == "data"
    assert pq.read_table(dst / c.DATA_DIR / "train").num_rows == 4  # the Parquet is untouched


def test_reexport_removes_domains_it_no_longer_has(dst: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_h5(dst, out)
    (out / "notes.txt").write_text("mine")
    (out / "code" / "mine.txt").write_text("mine")
    write_bin(make_dst(tmp_path / "wiki_only", [r for r in ROWS if r[0] == "wiki"]), out)
    assert sorted(p.name for p in out.iterdir()) == ["_export.json", "code", "notes.txt", "wiki"]
    assert [p.name for p in (out / "code").iterdir()] == ["mine.txt"]  # only our files go
    assert sorted(p.name for p in (out / "wiki").iterdir()) == PLAIN  # data.h5 replaced


def test_errors_are_etl_errors_with_a_fix(dst: Path, tmp_path: Path) -> None:
    with pytest.raises(EtlError, match="pick a split from"):
        write_bin(dst, tmp_path / "out", split="val")
    with pytest.raises(EtlError, match=">= 1"):
        write_h5(dst, tmp_path / "out", max_tokens_per_shard=0)
    with pytest.raises(EtlError, match="etl run"):
        write_bin(tmp_path / "nothing", tmp_path / "out")
    case = make_dst(tmp_path / "case", [("Wiki", [1], [T]), ("wiki", [2], [T])])
    with pytest.raises(EtlError, match="differ only in case"):
        write_bin(case, tmp_path / "case_out")
    assert not list((tmp_path / "case_out" / "Wiki").iterdir())  # temporary files removed
    write_bin(dst, tmp_path / "out")
    (tmp_path / "out" / "code" / "sequence.bin").write_bytes(b"\0" * 8)
    with pytest.raises(EtlError, match="re-export"):
        read_bin(tmp_path / "out" / "code")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "etl", *args]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=REPO, timeout=60)


def test_cli_export_bin_and_clear_errors(dst: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = _cli("export", str(dst), str(out), "--format", "bin", "--max-tokens-per-shard", "5")
    assert done.returncode == 0, done.stderr
    assert f"wiki: 6 episodes, 21 tokens -> {out / 'wiki'}" in done.stdout
    assert len(read_meta(out / "wiki")["shards"]) == 4
    for args in (
        ("export", str(tmp_path / "missing"), str(out), "--format", "bin"),
        ("export", str(dst), str(out), "--format", "h5", "--splits", "val"),
        ("export", str(dst), str(out), "--format", "bin", "--max-tokens-per-shard", "-1"),
    ):
        bad = _cli(*args)
        assert bad.returncode != 0
        assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
        assert bad.stderr.startswith("etl export: error: ")


def test_real_run_output_round_trips(tmp_path: Path) -> None:
    dst = tmp_path / "run"
    assert main(["run", str(REPO / "examples" / "raw"), str(dst)]) == 0
    assert main(["export", str(dst), str(tmp_path / "h5"), "--format", "h5"]) == 0
    write_bin(dst, dst, max_tokens_per_shard=300)
    table = pq.read_table(dst / c.DATA_DIR / "train", columns=[c.INPUT_IDS, c.LOSS_MASK])
    want = list(zip(table[c.INPUT_IDS].to_pylist(), table[c.LOSS_MASK].to_pylist(), strict=True))
    d = dst / c.DEFAULT_DOMAIN
    meta = read_meta(d)
    got = [s for k in range(len(meta["shards"])) for s in sequences(*read_bin(d, shard=k))]
    assert got == want and meta["num_sequences"] == len(want) > 0
    assert all(s["num_tokens"] <= 300 or s["num_sequences"] == 1 for s in meta["shards"])
    with h5py.File(tmp_path / "h5" / c.DEFAULT_DOMAIN / "data.h5", "r") as f:
        assert sequences(f["sequence"][:], f["loss_mask"][:], f["offsets"][:]) == want
    assert json.loads((dst / c.MANIFEST_FILE).read_text())["counts"]["written"] == len(want)
