"""Finding keys: 128-bit keys sorted by (high, low) word, looked up with `np.searchsorted`.

Sorted numpy arrays instead of a hash join: a chunk's ~30k keys are found in an index of n keys in
O(30k log n) with no table built per chunk (a Polars join rehashed the whole index each time).
24 bytes per key: a 4 GB cache of chat turns (~30M texts) indexes in ~0.7 GB (its sort: docs/design.md,
Measured costs).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

MISSING = -1


class KeyIndex(NamedTuple):
    """Keys sorted by (k0, k1), each once, with where its ids are: segment number and row."""

    k0: np.ndarray  # uint64
    k1: np.ndarray  # uint64
    seg: np.ndarray  # int64
    row: np.ndarray  # int64


def empty() -> KeyIndex:
    return KeyIndex(np.zeros(0, np.uint64), np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int64))


def build(keys: np.ndarray, seg: np.ndarray, row: np.ndarray) -> KeyIndex:
    """The index of keys (n, 2); a key given twice keeps its first place (a stable sort)."""
    order = np.lexsort((keys[:, 1], keys[:, 0]))
    k0, k1 = keys[order, 0], keys[order, 1]
    first = np.ones(len(order), dtype=bool)
    first[1:] = (k0[1:] != k0[:-1]) | (k1[1:] != k1[:-1])
    return KeyIndex(k0[first], k1[first], seg[order][first], row[order][first])


def extend(index: KeyIndex, keys: np.ndarray, seg: np.ndarray, row: np.ndarray) -> KeyIndex:
    """The index with more keys (those already in it keep their place)."""
    both = np.concatenate([np.stack([index.k0, index.k1], axis=1), keys])
    return build(both, np.concatenate([index.seg, seg]), np.concatenate([index.row, row]))


def find(index: KeyIndex, keys: np.ndarray) -> np.ndarray:
    """Position in the index of each key (n, 2), MISSING where it is not there."""
    q0, q1 = keys[:, 0], keys[:, 1]
    lo = np.searchsorted(index.k0, q0, side="left")
    hi = np.searchsorted(index.k0, q0, side="right")
    at = lo.copy()
    # Keys sharing their first 64 bits (~n^2 / 2^65 pairs: none in practice) are told apart by
    # their second word, sorted within the run.
    for i in np.flatnonzero(hi - lo > 1):
        at[i] = lo[i] + np.searchsorted(index.k1[lo[i] : hi[i]], q1[i])
    at = np.minimum(at, np.maximum(hi - 1, 0))
    found = (hi > lo) & (index.k1[np.minimum(at, max(len(index.k1) - 1, 0))] == q1) if len(index.k0) else hi > lo
    return np.where(found, at, MISSING)
