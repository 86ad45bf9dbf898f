"""Global, deterministic dedup for `--engine ray`: which keys each chunk has already met in an
earlier chunk, found by a Ray Data groupby and join, never by a set on the driver.

The local engine keeps a record when it is the first of its key in its chunk and no earlier chunk
(file order, then chunk order) had the key (`Deduplicator`). Here each chunk emits its distinct
keys with its position `ord`; a groupby on the key takes the first `ord`; a join marks every other
(key, chunk) pair; a groupby per chunk lists them. A worker then keeps exactly what the local
engine keeps (`etl.engine.worker.EarlierKeys`). Memory: 24 B per distinct (key, chunk) pair,
spread over the cluster's object stores (spilled to disk beyond them).
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from ray.data import Dataset
from ray.data.aggregate import Min

from etl import columns as c
from etl.engine.chunks import CHUNK, FILE, ChunkRow
from etl.ingest.discover import Source
from etl.ingest.preprocess import record_keys

KEY, ORD, FIRST, EARLIER = "key", "ord", "first", "earlier"
KEYS_SCHEMA = pa.schema([(KEY, pa.uint64()), (FILE, pa.int32()), (CHUNK, pa.int32()), (ORD, pa.int64())])
EARLIER_SCHEMA = pa.schema([(FILE, pa.int32()), (CHUNK, pa.int32()), (EARLIER, pa.list_(pa.uint64()))])


def chunk_keys(batch: pa.Table, *, sources: list[Source], exact: bool, split_seed: int) -> pa.Table:
    """The distinct dedup keys of each parsed chunk's good records, with the chunk's position."""
    con = duckdb.connect()
    out = [KEYS_SCHEMA.empty_table()]
    for row in ChunkRow.rows_of(batch):
        if row.table is None:
            continue
        good = row.table.filter(pc.is_null(row.table.column(c.REASON)))
        if good.num_rows == 0:
            continue
        keys, _ = record_keys(con, good, source=sources[row.file].name, exact=exact, split_seed=split_seed)
        keys = np.unique(keys.astype(np.uint64))
        n = len(keys)
        out.append(pa.table([pa.array(keys), pa.array(np.full(n, row.file, np.int32)),
                             pa.array(np.full(n, row.chunk, np.int32)),
                             pa.array(np.full(n, (row.file << 32) | row.chunk, np.int64))], schema=KEYS_SCHEMA))
    return pa.concat_tables(out)


def _later(batch: pa.Table) -> pa.Table:
    """(key, chunk) pairs whose chunk is not the key's first."""
    return batch.filter(pc.greater(batch.column(ORD), batch.column(FIRST))).select([KEY, FILE, CHUNK])


def _per_chunk(group: pa.Table) -> pa.Table:
    """One chunk's (file, chunk, keys met earlier) row."""
    keys = group.column(KEY).combine_chunks().cast(pa.uint64())
    return pa.table([group.column(FILE).slice(0, 1), group.column(CHUNK).slice(0, 1),
                     pa.array([keys.to_pylist()], pa.list_(pa.uint64()))], schema=EARLIER_SCHEMA)


def earlier_keys(parsed: Dataset, sources: list[Source], *, exact: bool, split_seed: int,
                 partitions: int) -> Dataset:
    """Per chunk that holds any: the keys an earlier chunk holds (`EARLIER_SCHEMA` rows)."""
    keys = parsed.map_batches(chunk_keys, fn_kwargs={"sources": sources, "exact": exact, "split_seed": split_seed},
                              batch_size=1, batch_format="pyarrow")
    first = keys.groupby(KEY).aggregate(Min(ORD, alias_name=FIRST))
    pairs = keys.join(first, "inner", num_partitions=partitions, on=(KEY,))
    later = pairs.map_batches(_later, batch_format="pyarrow")
    return later.groupby([FILE, CHUNK]).map_groups(_per_chunk, batch_format="pyarrow")
