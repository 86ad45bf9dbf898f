"""`Deduplicator.keep`: exactly the first occurrence of each key survives, within a chunk and
across chunks, however the hash table grows."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.ingest.preprocess import MAX_LOAD, MIN_SLOTS, Deduplicator


def reference(chunks: list[list[int]]) -> list[list[bool]]:
    """Plain per-key Python: a key is kept the first time it is ever seen."""
    seen: set[int] = set()
    masks = []
    for chunk in chunks:
        mask = []
        for key in chunk:
            mask.append(key not in seen)
            seen.add(key)
        masks.append(mask)
    return masks


def kept(chunks: list[list[int]]) -> list[list[bool]]:
    dedup = Deduplicator()
    return [dedup.keep(np.array(chunk, dtype=np.uint64)).tolist() for chunk in chunks]


# Few distinct keys (many repeats), the edges of uint64 (0 marks empty slots), and any key.
keys = st.one_of(st.integers(0, 5), st.sampled_from([0, 1, 2**63, 2**64 - 1]), st.integers(0, 2**64 - 1))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(keys, max_size=40), max_size=12))
def test_keep_is_the_first_occurrence_of_each_key(chunks: list[list[int]]) -> None:
    assert kept(chunks) == reference(chunks)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 8))
def test_keep_is_exact_while_the_table_grows(seed: int, scale: int) -> None:
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 2**64 - 1, size=MIN_SLOTS * scale, dtype=np.uint64, endpoint=True)
    chunks = [pool[rng.integers(0, len(pool), int(rng.integers(0, MIN_SLOTS)))].tolist() for _ in range(12)]
    dedup = Deduplicator()
    assert [dedup.keep(np.array(c, dtype=np.uint64)).tolist() for c in chunks] == reference(chunks)
    assert dedup.count == len(set().union(*map(set, chunks)) - {0})
    assert MIN_SLOTS < len(dedup.table) and dedup.count <= MAX_LOAD * len(dedup.table)
