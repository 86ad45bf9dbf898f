"""Shared test helpers: build pipeline inputs in memory and run the pipeline on them."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa

from etl.config import RunConfig
from etl.run import Context, build_context, build_examples, records_frame

MESSAGE_FIELDS = [("role", pa.string()), ("content", pa.string())]
OVERRIDES = [("train", pa.bool_()), ("weight", pa.float64())]


def pipeline_examples(convs: list[list[dict[str, object]]], config: RunConfig, tmp: Path) -> tuple[pl.DataFrame, pl.DataFrame, Context]:
    """Run the vectorized pipeline on in-memory conversations; returns (examples, plan, ctx).

    Messages may carry `train` / `weight` overrides, as a builder would produce them.
    """
    ctx = build_context(config, tmp)
    with_overrides = any("train" in m or "weight" in m for conv in convs for m in conv)
    message = pa.struct(MESSAGE_FIELDS + (OVERRIDES if with_overrides else []))
    good = pa.table(
        {"source_line": pa.array(range(len(convs)), pa.int64()), "messages": pa.array(convs, pa.list_(message))}
    )
    examples, plan = build_examples(records_frame("mem.jsonl", good), ctx)
    return examples, plan, ctx
