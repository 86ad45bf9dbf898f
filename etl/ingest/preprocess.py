"""Record-level preprocessing between parsing and tokenizing: dedup keys, splits, domains.

Hashes are MD5 (DuckDB `md5_number_lower`): stable across versions and machines, unlike
Polars' or DuckDB's `hash`, so the same record lands in the same split everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl import columns as c
from etl.arrow_values import numbers_of, string_array

# The prefix200 dedup: "exact duplicates via MD5 of first 200 chars" of the record's text; `exact`
# hashes the whole conversation instead.
PREFIX_CHARS = 200

_KEYS = """
with keyed as (
    select
        source_line,
        array_to_string(list_transform(messages, lambda m: m.role || ': ' || m.content), chr(10)) as text,
        $source || ':' || source_line as id,
        {images} as images_key
    from good
),
final as (
    select
        source_line,
        xor(md5_number_lower(case when $prefix > 0 then left(text, $prefix) else text end), images_key) as dedup_key,
        (md5_number_lower($seed || '/' || id) % 1000000) / 1000000.0 as split_draw
    from keyed
)
select * from final
"""


# A record's images mix into its key (the same text over other images is another example): an MD5
# of their references as written, with the data file's folder (relative paths are relative to it).
# References, not file contents: the Ray engine keys parsed chunks before any image is read.
IMAGE_KEY = ("case when len(images) > 0 then md5_number_lower($folder || chr(0) || array_to_string(images, chr(31))) "
             "else 0::ubigint end")
KEYS_SQL = _KEYS.format(images="0::ubigint")
IMAGE_KEYS_SQL = _KEYS.format(images=IMAGE_KEY)


# Dedup keys live in an open-addressing hash table (linear probing, 0 marks an empty slot) kept
# at most MAX_LOAD full: 11-23 B per key (1M keys: 16 MiB), a lookup probes ~2-6 slots, and a
# chunk costs O(its keys) (bench/hot_path.py). The sorted array this replaced (8 B per key) went
# through every key seen so far with each chunk (np.isin, np.union1d): quadratic over a run. At 5M
# keys 0.7 ran as fast as 0.5 with half the table (64 MiB); 0.8 ran slower (the times:
# docs/design.md, Measured costs).
MAX_LOAD = 0.7
MIN_SLOTS = 1 << 10
# Multiplicative (Fibonacci) hashing: the top bits of key * 2^64/phi spread any keys evenly,
# not only MD5's already uniform ones.
_FIB = np.uint64(0x9E3779B97F4A7C15)


@dataclass
class Deduplicator:
    """Remembers every dedup key seen in the run (a hash table of uint64 keys, see MAX_LOAD)."""

    table: np.ndarray = field(default_factory=lambda: np.zeros(MIN_SLOTS, dtype=np.uint64))
    count: int = 0
    seen_zero: bool = False  # key 0 is remembered apart: 0 marks the table's empty slots

    def keep(self, keys: np.ndarray) -> np.ndarray:
        """Mask of records whose key is new: first in this chunk and not seen before."""
        keys = np.asarray(keys).astype(np.uint64, copy=False)
        uniq, first = np.unique(keys, return_index=True)  # first occurrences (a stable sort)
        nonzero = uniq != 0
        self._reserve(int(nonzero.sum()))
        new = np.full(len(uniq), not self.seen_zero)  # stays so only for key 0
        new[nonzero] = _find_or_add(self.table, uniq[nonzero])
        self.count += int(new[nonzero].sum())
        self.seen_zero |= not nonzero.all()
        fresh = np.zeros(len(keys), dtype=bool)
        fresh[first[new]] = True
        return fresh

    def _reserve(self, extra: int) -> None:
        """Grow the table (to a power of two) so `extra` more keys keep it under MAX_LOAD."""
        need = self.count + extra
        if need <= MAX_LOAD * len(self.table):
            return
        slots = len(self.table)
        while need > MAX_LOAD * slots:
            slots *= 2
        old = self.table[self.table != 0]
        self.table = np.zeros(slots, dtype=np.uint64)
        _find_or_add(self.table, old)


def _find_or_add(table: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Whether each of `keys` (distinct, non-zero) was new to `table`; adds the new ones.

    Vectorised linear probing, one slot per unresolved key a round: the key itself (seen),
    an empty slot (claimed; of keys claiming one slot in a round, the one whose write lands
    wins and the others probe on), or another key (probe the next slot). Slots are never
    emptied, so a key in the table is always met before an empty slot. Rounds run to the
    longest probe (tens under MAX_LOAD), each on fewer keys.
    """
    mask = len(table) - 1  # a power of two
    shift = np.uint64(64 - mask.bit_length())
    new = np.zeros(len(keys), dtype=bool)
    todo = np.arange(len(keys))
    pos = ((keys * _FIB) >> shift).astype(np.intp)
    while len(todo):
        slot = table[pos]
        empty = slot == 0
        table[pos[empty]] = keys[empty]
        won = empty.copy()
        won[empty] = table[pos[empty]] == keys[empty]
        new[todo[won]] = True
        going = ~won & (slot != keys)
        todo, keys, pos = todo[going], keys[going], (pos[going] + 1) & mask
    return new


def record_keys(
    con: duckdb.DuckDBPyConnection, good: pa.Table, *, source: str, exact: bool, split_seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """(dedup key uint64, split draw in [0, 1)) per good record of a chunk.

    A preference pair (a `rejected` conversation beside `messages`) repeats only when both its
    conversations do: its key mixes the two conversations' keys; its draw is the chosen one's.
    """
    with_images = [c.IMAGES] if c.IMAGES in good.column_names else []
    keys, draws = _keys(con, good.select([c.SOURCE_LINE, "messages", *with_images]), source, exact, split_seed)
    if "rejected" in good.column_names:
        other = good.select([c.SOURCE_LINE, "rejected"]).rename_columns([c.SOURCE_LINE, "messages"])
        keys = keys * np.uint64(PAIR_MIX) ^ _keys(con, other, source, exact, split_seed)[0]
    return keys, draws


PAIR_MIX = 0x9E3779B97F4A7C15  # an odd 64-bit constant (2^64 / golden ratio): mixes two keys into one


def _keys(con: duckdb.DuckDBPyConnection, good: pa.Table, source: str, exact: bool,
          split_seed: int) -> tuple[np.ndarray, np.ndarray]:
    cur = con.cursor()  # its own registration: the pair's two key passes may run beside a parse
    cur.register("good", good)
    try:
        images = c.IMAGES in good.column_names
        keys = cur.sql(
            IMAGE_KEYS_SQL if images else KEYS_SQL,
            params={"source": source, "prefix": 0 if exact else PREFIX_CHARS, "seed": str(split_seed),
                    **({"folder": source.rpartition("/")[0]} if images else {})},
        ).to_arrow_table()
    finally:
        cur.close()
    return numbers_of(keys.column("dedup_key"), np.uint64), numbers_of(keys.column("split_draw"), np.float64)


def splits(draws: np.ndarray, val_fraction: float) -> pa.Array:
    """`val` for the records whose draw falls under val_fraction, else `train`."""
    picks = (np.asarray(draws) < val_fraction).astype(np.int8)
    return string_array(["train", "val"]).take(pa.Array.from_buffers(pa.int8(), len(picks), [None, pa.py_buffer(picks)]))


def domains(good: pa.Table, default: str = c.DEFAULT_DOMAIN) -> pa.Array:
    """The builder's `domain` column with nulls as `default` (the config file's `__default__`)."""
    fill = string_array([default])[0]
    if "domain" not in good.column_names:
        return pa.repeat(fill, good.num_rows)

    return pc.fill_null(good.column("domain").cast(pa.string()), fill)
