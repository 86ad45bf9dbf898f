"""Shared test helpers: build pipeline inputs in memory and run the pipeline on them."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa

from etl.config.run_config import RunConfig
from etl.pipeline.build import build_examples, records_frame
from etl.pipeline.resources import Resources, build_resources

MESSAGE_FIELDS = [("role", pa.string()), ("content", pa.string())]
OVERRIDES = [("train", pa.bool_()), ("weight", pa.float64())]


def pipeline_examples(convs: list[list[dict[str, object]]], config: RunConfig, tmp: Path) -> tuple[pl.DataFrame, pl.DataFrame, Resources]:
    """Run the vectorized pipeline on in-memory conversations; returns (examples, plan, ctx).

    Messages may carry `train` / `weight` overrides, as a builder would produce them.
    """
    ctx = build_resources(config)
    with_overrides = any("train" in m or "weight" in m for conv in convs for m in conv)
    message = pa.struct(MESSAGE_FIELDS + (OVERRIDES if with_overrides else []))
    good = pa.table(
        {"source_line": pa.array(range(len(convs)), pa.int64()), "messages": pa.array(convs, pa.list_(message))}
    )
    examples, plan = build_examples(records_frame("mem.jsonl", good), ctx)
    return examples, plan, ctx


def seal(root: Path, manifest: dict[str, object] | None = None) -> Path:
    """Write `manifest` (default: the one there) as `root/_manifest.json`, listing every Parquet
    part under data/, turns/ and _rejects/ with rows, bytes and sha256 as `etl run` does, so a
    hand-built or hand-edited DST reads as a finished output (readers accept only the parts a
    manifest lists, as recorded)."""
    import json

    import pyarrow.parquet as pq

    from etl import columns as c
    from etl.output.ownership import describe_file

    if manifest is None:
        manifest = json.loads((root / c.MANIFEST_FILE).read_text(encoding="utf-8"))

    parts = [p for p in sorted(root.rglob("*.parquet"))
             if p.relative_to(root).parts[0] in (c.DATA_DIR, c.TURNS_DIR, c.REJECTS_DIR)]
    files = [describe_file(p, root, rows=pq.read_metadata(p).num_rows) for p in parts]
    body = {"format_version": c.MANIFEST_FORMAT_VERSION, **manifest, "files": files}
    return write_manifest(root, body)


def write_manifest(root: Path, manifest: dict[str, object]) -> Path:
    """Write `manifest` as `root/_manifest.json` with its checksum, as etl does: for tests that edit
    a manifest and want the edit read (without it, readers refuse the manifest as damaged)."""
    import json

    from etl import columns as c
    from etl.output.verify import seal as seal_record

    root.mkdir(parents=True, exist_ok=True)
    (root / c.MANIFEST_FILE).write_text(json.dumps(seal_record(manifest), indent=2, sort_keys=True), encoding="utf-8")
    return root
