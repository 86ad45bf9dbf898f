"""Global, deterministic dedup for `--engine ray`: which keys each chunk has already met in an
earlier chunk, found by Ray Data groupbys (hash shuffles), never by a set on the driver.

The local engine keeps a record when it is the first of its key in its chunk and no earlier chunk
(file order, then chunk order) had the key (`Deduplicator`). Here each chunk emits its distinct
keys with its position `ord` (file << 32 | chunk); a groupby on the key lists the chunks holding
it, all but the first are "later"; a groupby per chunk lists its later keys, and a join hands them
to the chunk's worker, which then keeps exactly what the local engine keeps
(`etl.engine.worker.EarlierKeys`). Memory: 16 B per distinct (key, chunk) pair,
spread over the cluster's object stores (spilled to disk beyond them).
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from ray.data import Dataset
from ray.data.aggregate import AsList

from etl import columns as c
from etl.engine.chunks import CHUNK, FILE, ChunkRow
from etl.ingest.discover import Source
from etl.ingest.preprocess import record_keys

KEY, ORD, ORDS, EARLIER = "key", "ord", "ords", "earlier"
# Keys travel as int64 (the uint64 MD5 bits reinterpreted): Ray Data aggregations handle int64.
KEYS_SCHEMA = pa.schema([(KEY, pa.int64()), (ORD, pa.int64())])
LATER_SCHEMA = KEYS_SCHEMA
EARLIER_SCHEMA = pa.schema([(FILE, pa.int32()), (CHUNK, pa.int32()), (EARLIER, pa.list_(pa.int64()))])


def _chunk_keys(batch: pa.Table, *, sources: list[Source], exact: bool, split_seed: int) -> pa.Table:
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
        keys = np.unique(keys.astype(np.uint64)).view(np.int64)
        n = len(keys)
        out.append(pa.table([pa.array(keys), pa.array(np.full(n, (row.file << 32) | row.chunk, np.int64))],
                            schema=KEYS_SCHEMA))
    return pa.concat_tables(out)


def _later(batch: pa.Table) -> pa.Table:
    """(key, ord) for every chunk holding the key after its first one (numpy over the lists)."""
    ords = batch.column(ORDS).combine_chunks()
    lengths = pc.list_value_length(ords).to_numpy(zero_copy_only=False)
    ords = ords.filter(pa.array(lengths > 1))
    keys = batch.column(KEY).combine_chunks().filter(pa.array(lengths > 1)).to_numpy()
    values = pc.list_flatten(ords).to_numpy()
    parent = pc.list_parent_indices(ords).to_numpy()
    if not len(values):
        return LATER_SCHEMA.empty_table()
    starts = np.flatnonzero(np.r_[True, parent[1:] != parent[:-1]])
    first = np.minimum.reduceat(values, starts)[np.searchsorted(starts, np.arange(len(parent)), "right") - 1]
    later = values != first
    return pa.table([pa.array(keys[parent[later]]), pa.array(values[later])], schema=LATER_SCHEMA)


def _split_ord(batch: pa.Table) -> pa.Table:
    """(file, chunk, keys) rows from (ord, keys) rows."""
    ords = batch.column(ORD).to_numpy()
    return pa.table([pa.array((ords >> 32).astype(np.int32)), pa.array((ords & 0xFFFFFFFF).astype(np.int32)),
                     batch.column(EARLIER).cast(pa.list_(pa.int64()))], schema=EARLIER_SCHEMA)


def earlier_keys(parsed: Dataset, sources: list[Source], *, exact: bool, split_seed: int,
                 partitions: int) -> Dataset:
    """Per chunk that holds any: the keys an earlier chunk holds (`EARLIER_SCHEMA` rows).

    Two hash shuffles of small rows: by key (the chunks holding each key), then by chunk.
    """
    keys = parsed.map_batches(_chunk_keys, fn_kwargs={"sources": sources, "exact": exact, "split_seed": split_seed},
                              batch_size=1, batch_format="pyarrow")
    per_key = keys.groupby(KEY, num_partitions=partitions).aggregate(AsList(ORD, alias_name=ORDS))
    later = per_key.map_batches(_later, batch_format="pyarrow")
    per_chunk = later.groupby(ORD, num_partitions=partitions).aggregate(AsList(KEY, alias_name=EARLIER))
    return per_chunk.map_batches(_split_ord, batch_format="pyarrow")
