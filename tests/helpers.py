"""Shared test helpers: build pipeline inputs in memory and run the pipeline on them."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa

from etl.config import RunConfig
from etl.run import Context, build_context, build_examples, records_frame

MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


def pipeline_examples(convs: list[list[dict[str, str]]], config: RunConfig, tmp: Path) -> tuple[pl.DataFrame, pl.DataFrame, Context]:
    """Run the vectorized pipeline on in-memory conversations; returns (examples, plan, ctx)."""
    ctx = build_context(config, tmp)
    good = pa.table(
        {"source_line": pa.array(range(len(convs)), pa.int64()), "messages": pa.array(convs, MESSAGES)}
    )
    examples, plan = build_examples(records_frame("mem.jsonl", good), ctx)
    return examples, plan, ctx
