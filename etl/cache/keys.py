"""Which texts are the same: exact repeats inside one batch, and the key of a text across runs.

`distinct` finds repeats by the strings themselves (Polars hashes them and compares equal hashes
byte by byte), so a batch is never wrong about a repeat. `content_keys` is the cache's key: the
text's MD5, 128 bits, computed by DuckDB over the Arrow buffers (faster than a Python loop over
hashlib, which is a loop per row: docs/design.md, Measured costs).
"""

from __future__ import annotations

import hashlib

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa

from etl.formats.builders import in_batches
from etl.tokens.backend import TOKENIZERS_IDS

TEXT, ROW = "text", "row"


def distinct(texts: pa.Array) -> tuple[np.ndarray, np.ndarray] | None:
    """(row of each distinct text's first occurrence, each row's distinct number), or None when no
    text repeats (then the caller encodes the batch as it is).

    One hash grouping in first-occurrence order gives both: each group's rows, scattered back as
    its number. It took half the time of `n_unique`, `unique` and a join back (5-7 vs 10-15 ms per
    40k texts of T0 x10); `pc.dictionary_encode` took several times longer on one thread
    (docs/design.md, Measured costs).
    """
    groups = pl.Series(TEXT, texts).to_frame().with_row_index(ROW).group_by(TEXT, maintain_order=True).agg(ROW)[ROW]
    if len(groups) == len(texts):
        return None
    number = np.empty(len(texts), np.int64)
    number[groups.explode().to_numpy()] = np.repeat(np.arange(len(groups)), groups.list.len().to_numpy())
    return groups.list.first().to_numpy().astype(np.int64), number


def content_keys(texts: pa.Array, con: duckdb.DuckDBPyConnection) -> np.ndarray:
    """The MD5 of every text as (n, 2) uint64: the digest's 16 bytes read as two little-endian words.

    DuckDB returns `md5_number` as a 128-bit Arrow decimal whose 16 bytes are the digest's
    (tests/cache compare them with hashlib); reading the buffer avoids a second pass for
    `md5_number_upper`/`_lower` (docs/design.md, Measured costs).
    """
    if not len(texts):
        return np.zeros((0, 2), np.uint64)
    # A batch per core, hashed in parallel (docs/design.md, Measured costs).
    table = in_batches(pa.table({TEXT: texts}))
    result = con.from_arrow(table).select(f"md5_number({TEXT}) AS k").to_arrow_table().column(0).combine_chunks()
    raw = np.frombuffer(result.buffers()[1], dtype=np.uint64)
    return raw[2 * result.offset : 2 * (result.offset + len(result))].reshape(-1, 2).copy()



def tagged(keys: np.ndarray, tag: str | None) -> np.ndarray:
    """`content_keys` as the cache stores the ids `tag` made (`backend.ContentBackend.made`):
    `tokenizers`' (the reference, tag None or "tokenizers") under the text's MD5, another
    encoder's under the MD5 xor the tag's, so a run is served another encoder's ids only when it
    looks them up by that encoder's tag (`ContentBackend.served`)."""
    if tag is None or tag == TOKENIZERS_IDS:
        return keys
    salt = np.frombuffer(hashlib.md5(tag.encode()).digest(), dtype=np.uint64)
    return keys ^ salt
