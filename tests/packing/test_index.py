"""The pack index: built from lengths only, written under the writer protocol, read back exactly."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl import columns as c
from etl.cli import main
from etl.errors import EtlError
from etl.output.manifest import read_manifest
from etl.output.parts import listed_parts
from etl.output.verify import seal
from etl.packing.index import PACKS_SCHEMA, PackIndex, build_pack_index, index_packing, index_table
from etl.packing.index_io import read_pack_index, write_pack_index
from etl.packing.pieces import Packing, whole_examples

S = 96  # pack size of these tests; the run keeps examples up to 256 tokens, so some are longer


def make_dst(root: Path, *, n: int = 80) -> Path:
    """A real `etl run` (bytes tokenizer) of `n` chats of 20-400 characters, ~30% in val, written
    in many small data parts (so rows are numbered across parts)."""
    rng = random.Random(7)
    raw = root / "raw" / "chats.jsonl"
    raw.parent.mkdir(parents=True)
    lines = []
    for i in range(n):
        user, answer = f"question {i} " + "q" * rng.randint(5, 60), f"answer {i} " + "a" * rng.randint(5, 340)
        lines.append(json.dumps({"messages": [{"role": "user", "content": user},
                                              {"role": "assistant", "content": answer}]}))
    raw.write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = root / "cfg.json"
    config.write_text(json.dumps({"split": {"val_fraction": 0.3}}), encoding="utf-8")
    dst = root / "dst"
    args = ["run", str(raw), str(dst), "--config", str(config), "--seq-len", "256", "--chunk-mb", "0.002",
            "--quiet"]
    assert main(args) == 0
    return dst


@pytest.fixture(scope="module")
def dst(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dst(tmp_path_factory.mktemp("packidx"))


@pytest.fixture
def fresh(dst: Path, tmp_path: Path) -> Path:
    """A copy of the module's output that a test may write into (the manifest lists relative paths)."""
    shutil.copytree(dst, tmp_path / "dst")
    return tmp_path / "dst"


def split_table(dst: Path, split: str) -> dict[str, list]:
    """The split's ids and lengths in the loader's row order, read independently."""
    parts = listed_parts(dst, f"data/{split}")
    rows = [pq.read_table(p, columns=["id", "num_tokens", "input_ids"]).to_pydict() for p in parts]
    return {k: [v for r in rows for v in r[k]] for k in ("id", "num_tokens", "input_ids")}


def test_the_fixture_has_both_splits_in_several_parts_and_long_examples(dst: Path) -> None:
    for split in ("train", "val"):
        assert len(listed_parts(dst, f"data/{split}")) >= 2
    assert max(split_table(dst, "train")["num_tokens"]) > S


@pytest.mark.parametrize("strategy", ["bfd", "ffd"])
@pytest.mark.parametrize("truncation", ["right", "left"])
def test_whole_example_index_places_every_example_once_clipped_to_s(
    dst: Path, strategy: str, truncation: str
) -> None:
    data = split_table(dst, "train")
    lengths = np.array(data["num_tokens"])
    index = build_pack_index(dst, "train", strategy=strategy, seq_len=S, truncation=truncation)
    p = index.packing
    assert sorted(p.doc.tolist()) == list(range(len(lengths)))  # every example in exactly one pack
    assert p.pack_tokens().max() <= S and p.num_packs == len(np.unique(p.pack))
    assert index.clipped == int((lengths > S).sum()) > 0
    np.testing.assert_array_equal(p.length, np.minimum(lengths[p.doc], S))
    want_start = np.where(lengths[p.doc] > S, lengths[p.doc] - S, 0) if truncation == "left" else 0
    np.testing.assert_array_equal(p.start, np.zeros_like(p.start) + want_start)
    assert list(index.ids) == [data["id"][r] for r in p.doc]
    summary = index.summary()
    assert summary["num_examples"] == len(lengths) and summary["num_tokens"] == int(np.minimum(lengths, S).sum())
    assert summary["utilization"] == pytest.approx(summary["num_tokens"] / (p.num_packs * S))
    assert summary["fingerprint"] == index.fingerprint and len(index.fingerprint) == 16


def test_sequential_index_splits_long_examples_and_loses_no_token(dst: Path) -> None:
    lengths = np.array(split_table(dst, "val")["num_tokens"])
    index = build_pack_index(dst, "val", strategy="sequential", seq_len=S)
    p = index.packing
    assert index.clipped == 0 and int(p.length.sum()) == int(lengths.sum())
    assert p.num_packs == -(-int(lengths.sum()) // S)
    np.testing.assert_array_equal(np.bincount(p.doc, weights=p.length), lengths)  # every token once


def test_stream_index_reads_the_turns_and_keeps_the_packers_masks(fresh: Path) -> None:
    data = split_table(fresh, "train")
    lengths = np.array(data["num_tokens"])
    index = build_pack_index(fresh, "train", strategy="stream", seq_len=S)
    p = index.packing
    assert index.clipped == 0 and p.pack_tokens().max() <= S
    assert index.summary()["num_examples"] == len(lengths)  # every example starts in some pack
    assert bool(np.all(p.start + p.length <= lengths[p.doc]))
    # Examples are longer than S here, so blocks start mid-conversation: injected, untrained pieces.
    assert p.trained is not None and not p.trained.all()
    write_pack_index(fresh, {"train": index})
    back = read_pack_index(fresh, "train")
    assert back is not None and back.strategy == "stream"
    np.testing.assert_array_equal(back.packing.trained, p.trained)


def test_rows_are_the_loaders_global_rows(dst: Path) -> None:
    torch_dataset = pytest.importorskip("etl.loader.dataset")
    ds = torch_dataset.ParquetDataset(dst, split="train", min_tokens=0)
    index = build_pack_index(dst, "train", strategy="bfd", seq_len=S)
    data = split_table(dst, "train")
    for doc in index.packing.doc[:: max(1, len(index.packing) // 25)]:
        np.testing.assert_array_equal(ds[int(doc)]["input_ids"], data["input_ids"][doc])
    assert index.fingerprint == ds.fingerprint


def test_written_index_reads_back_exactly_and_lands_in_the_manifest(fresh: Path) -> None:
    dst = fresh
    built = {s: build_pack_index(dst, s, strategy="ffd", seq_len=S, max_docs_per_bin=3) for s in ("train", "val")}
    record = write_pack_index(dst, built)
    for split, index in built.items():
        back = read_pack_index(dst, split)
        assert back is not None and back.summary() == index.summary() == record["splits"][split]
        for name in ("doc", "start", "length", "pack"):
            np.testing.assert_array_equal(getattr(back.packing, name), getattr(index.packing, name))
        assert list(back.ids) == list(index.ids) and back.options == {"max_docs_per_bin": 3}
        assert np.bincount(back.packing.pack).max() <= 3
        rows_only = read_pack_index(dst, split, ids=False)
        assert rows_only is not None and rows_only.ids is None
    assert read_manifest(dst)[c.MANIFEST_PACKS] == record["splits"]  # a copy of `_packs.json`'s
    assert json.loads((dst / c.PACKS_FILE).read_text())["files"] == record["files"]
    assert {f["path"] for f in record["files"]} == {"packs/train/part-00000.parquet", "packs/val/part-00000.parquet"}
    assert pq.read_schema(dst / record["files"][0]["path"]).remove_metadata() == PACKS_SCHEMA


def test_no_index_is_none_and_a_stale_index_says_to_repack(fresh: Path) -> None:
    dst = fresh
    assert read_pack_index(dst, "train") is None
    write_pack_index(dst, {"train": build_pack_index(dst, "train", strategy="bfd", seq_len=S)})
    assert read_pack_index(dst, "val") is None
    record = json.loads((dst / c.PACKS_FILE).read_text())
    record["splits"]["train"]["fingerprint"] = "0" * 16  # as if the data changed under the index
    (dst / c.PACKS_FILE).write_text(json.dumps(seal(record)))  # resealed: the fingerprint must tell
    with pytest.raises(EtlError, match=r"built from other data.*rerun `etl pack`"):
        read_pack_index(dst, "train")


def test_an_index_built_before_the_data_changed_is_not_written(fresh: Path) -> None:
    dst = fresh
    index = build_pack_index(dst, "train", strategy="bfd", seq_len=S)
    stale = PackIndex(packing=index.packing, strategy="bfd", seq_len=S, seed=0, options={},
                      fingerprint="f" * 16, ids=index.ids)
    with pytest.raises(EtlError, match="changed while it was packed"):
        write_pack_index(dst, {"train": stale})
    assert not (dst / c.PACKS_FILE).exists() and c.MANIFEST_PACKS not in read_manifest(dst)


def test_errors_name_the_fix(dst: Path, tmp_path: Path) -> None:
    with pytest.raises(EtlError, match="splits present: train, val"):
        build_pack_index(dst, "test", strategy="bfd", seq_len=S)
    with pytest.raises(EtlError, match="truncation must be one of right, left"):
        build_pack_index(dst, "train", strategy="bfd", seq_len=S, truncation="middle")
    with pytest.raises(EtlError, match="choose one of"):
        build_pack_index(dst, "train", strategy="best", seq_len=S)
    with pytest.raises(EtlError, match="not a finished etl output"):
        write_pack_index(tmp_path, {})


def test_the_command_strategies_are_the_registry() -> None:
    from etl.packing.registry import PACKERS

    assert set(PACKERS) == set(c.PACK_STRATEGIES)


@st.composite
def packings(draw: st.DrawFn) -> tuple[Packing, np.ndarray]:
    """Random packings (whole examples or windows, some pieces masked) and piece ids."""
    lengths = np.array(draw(st.lists(st.integers(1, 40), min_size=1, max_size=60)), dtype=np.int64)
    if draw(st.booleans()):
        bins = np.array(draw(st.lists(st.integers(0, 9), min_size=len(lengths), max_size=len(lengths))))
        _, bins = np.unique(bins, return_inverse=True)  # dense bin numbers, none empty
        p = whole_examples(bins, lengths, int(bins.max()) + 1)
    else:
        from etl.packing.sequential import sequential

        p = sequential(lengths, seq_len=draw(st.integers(1, 50)))
    if draw(st.booleans()):
        trained = np.array(draw(st.lists(st.booleans(), min_size=len(p), max_size=len(p))))
        p = Packing(doc=p.doc, start=p.start, length=p.length, pack=p.pack, num_packs=p.num_packs,
                    trained=None if trained.all() else trained)
    return p, np.array([f"ex-{d}" for d in p.doc], dtype=object)


@settings(max_examples=80, deadline=None)
@given(packings())
def test_table_round_trip_is_exact(case: tuple[Packing, np.ndarray]) -> None:
    p, ids = case
    index = PackIndex(packing=p, strategy="bfd", seq_len=64, seed=0, options={}, fingerprint="x", ids=ids)
    table = index_table(index)
    assert table.schema == PACKS_SCHEMA and table.num_rows == p.num_packs
    # Independent expectation: pack k's lists are its pieces in order.
    k = p.num_packs - 1
    mine = np.flatnonzero(p.pack == k)
    assert table.column(c.PIECE_ROWS)[k].as_py() == p.doc[mine].tolist()
    assert table.column(c.NUM_TOKENS)[k].as_py() == int(p.length[mine].sum())
    back, back_ids = index_packing(table)
    for name in ("doc", "start", "length", "pack"):
        np.testing.assert_array_equal(getattr(back, name), getattr(p, name))
    assert back.num_packs == p.num_packs and list(back_ids) == list(ids)
    if p.trained is None:
        assert back.trained is None
    else:
        np.testing.assert_array_equal(back.trained, p.trained)


def test_a_damaged_table_is_an_error() -> None:
    p = whole_examples(np.array([0, 0, 1]), np.array([3, 4, 5]), 2)
    index = PackIndex(packing=p, strategy="bfd", seq_len=8, seed=0, options={}, fingerprint="x",
                      ids=np.array(["a", "b", "c"], dtype=object))
    table = index_table(index)
    bad = table.set_column(6, c.NUM_TOKENS, table.column(c.NUM_TOKENS).cast("int64").cast("int32")[::-1])
    with pytest.raises(EtlError, match="damaged"):
        index_packing(bad)
