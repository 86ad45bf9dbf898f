"""What a Ray worker does to a chunk row: parse it, or run the local engine's `process_chunk` on it
and write its parts into DST's staging folder. Plain Python (no `import ray`): Ray calls these
through `map_batches`, and tests can call them directly.

Parts are staged as `<staging>/<file>-<chunk>/<folder>/part-<k>.parquet` (`StagedParts`): names the
chunk gives, not the worker or the order tasks ran in; the driver renames them into place
(`etl.engine.commit`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from etl.cache.folder import CacheSettings
from etl.engine.chunks import CHUNK, FILE, ChunkRow, to_ipc
from etl.formats.base import BuilderQuery
from etl.formats.builders import run_builder
from etl.ingest.discover import Source
from etl.output.part_writer import StagedParts
from etl.pipeline.chunk import RunState, process_chunk, reject_file
from etl.pipeline.plan import RunPlan
from etl.pipeline.resources import build_resources
from etl.pipeline.startup import tune_malloc

COUNTS, PARTS, TIMINGS, CACHE, BACKEND = "counts", "parts", "timings", "token_cache", "backend"
RESULT_SCHEMA = pa.schema([(FILE, pa.int32()), (CHUNK, pa.int32()), (COUNTS, pa.string()),
                           (PARTS, pa.string()), (TIMINGS, pa.string()), (CACHE, pa.string()),
                           (BACKEND, pa.string())])
_CON: list[duckdb.DuckDBPyConnection] = []  # one connection per worker process, made on first use


def parse_batch(batch: pa.Table, *, query: BuilderQuery) -> pa.Table:
    """Chunk rows of raw lines -> chunk rows of parsed records (`run_builder`, as the local engine)."""
    if not _CON:
        _CON.append(duckdb.connect())
    rows = []
    for row in ChunkRow.rows_of(batch):
        if row.table is not None:
            row = ChunkRow(row.file, row.chunk, run_builder(_CON[0], row.table, query))
        rows.append(row.to_table())
    return pa.concat_tables(rows)


class EarlierKeys:
    """`Deduplicator`'s interface for one chunk: a record is kept when it is the first of its key
    in the chunk and no earlier chunk (in file order) holds the key; the global groupby
    (`etl.engine.dedup`) found those keys."""

    def __init__(self, earlier: np.ndarray) -> None:
        self.earlier = earlier.astype(np.int64).view(np.uint64)  # int64 bits in transit (dedup.py)

    def keep(self, keys: np.ndarray) -> np.ndarray:
        keys = np.asarray(keys).astype(np.uint64, copy=False)
        _, first = np.unique(keys, return_index=True)
        fresh = np.zeros(len(keys), dtype=bool)
        fresh[first] = True
        return fresh & ~np.isin(keys, self.earlier)


class ChunkProcessor:
    """A Ray actor's state: the run's resources (tokenizer loaded once per actor)."""

    def __init__(self, plan: RunPlan, sources: list[Source], staging: str, *, identity: dict[str, str],
                 threads: int = 1, cache: CacheSettings | None = None) -> None:
        # The tokenizer's Rust pool reads this when it first runs. Set here, not in a runtime_env:
        # Ray starts a dedicated worker process for each distinct runtime_env.
        os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
        tune_malloc()  # the local engine's memory bound on every worker too
        self.res = build_resources(plan, cache=cache)  # the token cache of the worker's node
        self.sources, self.staging = sources, Path(staging)
        # From the driver, not computed here: this config's tokenizer path is made absolute.
        self.identity = identity

    def __call__(self, batch: pa.Table) -> pa.Table:
        earlier = batch.column("earlier").to_pylist() if "earlier" in batch.column_names else None
        out = [self.process(row, np.array(earlier[i] or [], dtype=np.int64) if earlier else None)
               for i, row in enumerate(ChunkRow.rows_of(batch))]
        return pa.table({name: [o[name] for o in out] for name in RESULT_SCHEMA.names}, schema=RESULT_SCHEMA)

    def process(self, row: ChunkRow, earlier: np.ndarray | None) -> dict[str, Any]:
        """Process one chunk row as the local engine does; its counts, parts and timings."""
        source = self.sources[row.file]
        # Staged under names the chunk gives, not the worker or the order tasks ran in.
        parts = StagedParts(None, self.staging, identity=self.identity, prefix=f"{row.file:06d}-{row.chunk:06d}")
        state = RunState(res=self.res, parts=parts)
        before = self.res.encoder.flush()
        if earlier is not None:
            state.dedup = EarlierKeys(earlier)  # type: ignore[assignment]  # Deduplicator's interface
        if row.error is not None:
            state.counts.read_per_file[source.name] = row.records_read
            reject_file(source, row.error, state.counts, parts)
        else:
            assert row.table is not None
            process_chunk(source, row.table, state)
        # An actor has no end to hook: each chunk's new ids are written as it finishes, and its
        # counts travel with its result (the driver sums them into the manifest).
        cached = self.res.encoder.flush()
        cached.add(before, -1)
        return {FILE: row.file, CHUNK: row.chunk, COUNTS: json.dumps(state.counts.to_json(incomplete=True)),
                PARTS: json.dumps(parts.entries), TIMINGS: json.dumps(state.timings),
                CACHE: json.dumps(dataclasses.asdict(cached)),
                # what encoded this worker's texts: each worker checks its backend as a local run does
                BACKEND: getattr(self.res.tokenizer, "backend_used", None)}


__all__ = ["ChunkProcessor", "EarlierKeys", "parse_batch", "to_ipc"]
