"""Fixtures for the loader tests: write an `etl run`-shaped DST (manifest + Parquet) from lists."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.columns import (
    DATA_DIR,
    DOMAIN,
    ID,
    INPUT_IDS,
    LOSS_MASK,
    LOSS_WEIGHT,
    NUM_TOKENS,
    NUM_TRAINED,
    NUM_TURNS,
    NUM_TURNS_DROPPED,
    SOURCE_FILE,
    SOURCE_LINE,
    SPLIT,
    TRUNCATED,
)
from tests.helpers import seal

Example = tuple[Sequence[int], Sequence[bool]]


def _table(
    examples: Sequence[Example], split: str, first: int, weights: list | None, domains: list | None = None
) -> pa.Table:
    n = len(examples)
    cols: dict[str, Any] = {
        ID: pa.array([f"{split}-{first + i}" for i in range(n)], pa.string()),
        SOURCE_FILE: pa.array(["fixture.jsonl"] * n, pa.string()),
        SOURCE_LINE: pa.array(range(first, first + n), pa.int64()),
        DOMAIN: pa.array(["__default__"] * n if domains is None else domains, pa.string()),
        SPLIT: pa.array([split] * n, pa.string()),
        INPUT_IDS: pa.array([list(ids) for ids, _ in examples], pa.list_(pa.int32())),
        LOSS_MASK: pa.array([list(map(bool, m)) for _, m in examples], pa.list_(pa.bool_())),
        NUM_TOKENS: pa.array([len(ids) for ids, _ in examples], pa.int32()),
        NUM_TRAINED: pa.array([int(sum(m)) for _, m in examples], pa.int32()),
        NUM_TURNS: pa.array([3] * n, pa.int32()),
        NUM_TURNS_DROPPED: pa.array([0] * n, pa.int32()),
        TRUNCATED: pa.array([False] * n, pa.bool_()),
    }
    if weights is not None:
        cols[LOSS_WEIGHT] = pa.array(weights, pa.list_(pa.float32()))
    return pa.table(cols)


def write_dst(
    root: Path,
    splits: dict[str, Sequence[Example]],
    *,
    rows_per_group: int = 4,
    rows_per_file: int | None = None,
    manifest: dict[str, Any] | None = None,
    weights: dict[str, list] | None = None,
    domains: dict[str, list] | None = None,
) -> Path:
    """Write ``root`` as `etl run` would: ``data/<split>/part-NNNNN.parquet`` and a manifest.

    Args:
        root: directory to create.
        splits: split name -> list of (input_ids, loss_mask).
        rows_per_group: Parquet row group size.
        rows_per_file: rows per part file (default: one file per split).
        manifest: manifest keys overriding the defaults (pad_id 0, eot_id 1, seq_len 16).
        weights: split name -> per-example float lists for a `loss_weight` column.
        domains: split name -> per-example `domain` values (default ``__default__``).
    """
    for split, examples in splits.items():
        out = root / DATA_DIR / split
        out.mkdir(parents=True, exist_ok=True)
        per_file = rows_per_file or max(len(examples), 1)
        for part, first in enumerate(range(0, max(len(examples), 1), per_file)):
            chunk = examples[first : first + per_file]
            w = None if weights is None else weights[split][first : first + per_file]
            d = None if domains is None else domains[split][first : first + per_file]
            pq.write_table(
                _table(chunk, split, first, w, d),
                out / f"part-{part:05d}.parquet",
                row_group_size=rows_per_group,
            )
    meta = {
        "pad_id": 0,
        "eot_id": 1,
        "seq_len": 16,
        "tokenizer": "fixture",
        "template": "fixture",
        "counts": {},
        "splits": {s: len(e) for s, e in splits.items()},
    }
    meta.update(manifest or {})
    return seal(root, meta)


def random_examples(n: int, *, seed: int, min_len: int = 2, max_len: int = 16) -> list[Example]:
    """Examples with distinct ids (row r holds 1000*r + position) and a random mask.

    The first token is never trained, as in real data (it is a role header), so every trained
    token can appear as a target ``y``.
    """
    rng = np.random.default_rng(seed)
    out = []
    for r in range(n):
        length = int(rng.integers(min_len, max_len + 1))
        mask = rng.random(length) < 0.5
        mask[0] = False
        out.append(([1000 * r + p for p in range(length)], mask.tolist()))
    return out


@pytest.fixture
def dst(tmp_path: Path) -> Path:
    """50 train rows (row groups of 8, files of 20 rows) and 10 val rows, lengths 2..16."""
    return write_dst(
        tmp_path / "dst",
        {"train": random_examples(50, seed=1), "val": random_examples(10, seed=2)},
        rows_per_group=8,
        rows_per_file=20,
    )
