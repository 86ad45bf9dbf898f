"""Record-level preprocessing between parsing and tokenizing: dedup keys, splits, domains.

Hashes are MD5 (DuckDB `md5_number_lower`): stable across versions and machines, unlike
Polars' or DuckDB's `hash`, so the same record lands in the same split everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa

from etl import columns as c

# Seed 004: "exact duplicates via MD5 of first 200 chars" of the record's text; `exact`
# hashes the whole conversation instead.
PREFIX_CHARS = 200

KEYS_SQL = """
with keyed as (
    select
        source_line,
        array_to_string(list_transform(messages, lambda m: m.role || ': ' || m.content), chr(10)) as text,
        $source || ':' || source_line as id
    from good
),
final as (
    select
        source_line,
        md5_number_lower(case when $prefix > 0 then left(text, $prefix) else text end) as dedup_key,
        (md5_number_lower($seed || '/' || id) % 1000000) / 1000000.0 as split_draw
    from keyed
)
select * from final
"""


@dataclass
class Deduplicator:
    """Remembers every dedup key seen in the run (8 bytes per record, sorted numpy array)."""

    seen: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))

    def keep(self, keys: np.ndarray) -> np.ndarray:
        """Mask of records whose key is new: first in this chunk and not seen before."""
        _, first = np.unique(keys, return_index=True)
        first_here = np.zeros(len(keys), dtype=bool)
        first_here[first] = True
        fresh = first_here & ~np.isin(keys, self.seen)
        self.seen = np.union1d(self.seen, keys)
        return fresh


def record_keys(
    con: duckdb.DuckDBPyConnection, good: pa.Table, *, source: str, exact: bool, split_seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """(dedup key uint64, split draw in [0, 1)) per good record of a chunk."""
    con.register("good", good.select([c.SOURCE_LINE, "messages"]))
    try:
        keys = con.sql(
            KEYS_SQL, params={"source": source, "prefix": 0 if exact else PREFIX_CHARS, "seed": str(split_seed)}
        ).to_arrow_table()
    finally:
        con.unregister("good")
    return keys.column("dedup_key").to_numpy(), keys.column("split_draw").to_numpy()


def splits(draws: np.ndarray, val_fraction: float) -> pa.Array:
    """`val` for the records whose draw falls under val_fraction, else `train`."""
    return pa.array(np.where(draws < val_fraction, "val", "train"), pa.string())


def domains(good: pa.Table) -> pa.Array:
    """The builder's `domain` column with nulls as `__default__` (seed 004)."""
    if "domain" not in good.column_names:
        return pa.array([c.DEFAULT_DOMAIN] * good.num_rows, pa.string())
    import pyarrow.compute as pc

    return pc.fill_null(good.column("domain").cast(pa.string()), c.DEFAULT_DOMAIN)
