"""Round trip: JSONL -> `etl run` -> ParquetLoader / episodes == seed 000's collate of the rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from etl.cli import main
from etl.columns import INPUT_IDS, LOSS_MASK
from etl.export.episode_loader import EpisodeDataLoader
from etl.export.training_xml import TrainingConfig
from etl.loader.dataloader import ParquetLoader
from etl.loader.groups import PadOptions
from etl.output.manifest import read_manifest

S = 64


@pytest.fixture(scope="module")
def run_dst(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("roundtrip")
    rng = np.random.default_rng(0)
    with open(root / "chats.jsonl", "w", encoding="utf-8") as f:
        for i in range(40):
            turns = []
            for t in range(int(rng.integers(1, 4))):  # some chats exceed S and get truncated
                turns += [
                    {"role": "user", "content": f"q{i}.{t} " * int(rng.integers(1, 6))},
                    {"role": "assistant", "content": f"a{i}.{t} " * int(rng.integers(1, 6))},
                ]
            f.write(json.dumps({"messages": turns}) + "\n")
    dst = root / "dst"
    assert main(["run", str(root / "chats.jsonl"), str(dst), "--seq-len", str(S)]) == 0
    return dst


def test_loader_batches_equal_seed_000_collate_of_the_rows(run_dst: Path) -> None:
    sft = pytest.importorskip("etl.sft")
    table = pq.read_table(run_dst / "data" / "train", columns=[INPUT_IDS, LOSS_MASK])
    rows = list(zip(table[INPUT_IDS].to_pylist(), table[LOSS_MASK].to_pylist(), strict=True))
    assert max(len(ids) for ids, _ in rows) <= S  # etl run already cut to S
    manifest = read_manifest(run_dst)
    loader = ParquetLoader(run_dst, batch_size=8, shuffle=False, drop_last=False)
    assert loader.seq_len == S and loader.pad_id == manifest["pad_id"]
    got = list(loader)
    pad = manifest["pad_id"]
    for k, batch in enumerate(got):
        packed = [
            (ids + [pad] * (S - len(ids)), m + [False] * (S - len(m)))
            for ids, m in rows[8 * k : 8 * k + 8]
        ]
        x, y, loss_mask = sft.collate_sft_batch(packed, T=S - 1, device="cpu")
        assert torch.equal(batch["x"], x) and torch.equal(batch["y"], y)
        assert torch.equal(batch["loss_mask"], loss_mask)
    assert sum(len(b["x"]) for b in got) == len(rows)


def test_exported_episodes_give_the_same_batches(run_dst: Path, tmp_path: Path) -> None:
    assert main(["export", str(run_dst), str(tmp_path / "ep"), "--format", "episodes"]) == 0
    cfg = TrainingConfig(dataset_mode="sft_episode", epoch_shuffle=False, episode_min_tokens=0)
    episodes = EpisodeDataLoader(tmp_path / "ep", cfg, batch_size=8, block_size=S - 1)
    parquet = ParquetLoader(run_dst, batch_size=8, shuffle=False, collate=PadOptions(min_tokens=0))
    for batch in parquet:
        x, y, mask = episodes.get_batch("train")
        assert torch.equal(x, batch["x"])
        assert torch.equal(mask, batch["loss_mask"].float())
        trained = batch["loss_mask"]
        assert torch.equal(y[trained], batch["y"][trained])  # seed 002's y keeps raw ids elsewhere
