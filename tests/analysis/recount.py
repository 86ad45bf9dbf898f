"""Independent recounts of an etl output with pyarrow/numpy/Python, for the query tests.

They read the Parquet back and recount from the lists themselves (input_ids lengths,
loss_mask values), not from the num_* columns the queries may use.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds


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
    return {
        tuple(r[k] for k in keys) if len(keys) > 1 else r[keys[0]]: r for r in result.to_pylist()
    }
