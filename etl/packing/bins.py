"""Bin packers (seed 003's bin mode): best-fit and first-fit decreasing, every example whole.

FIRST VERSION: a plain loop per item (correct, slow); replaced by the grouped version below.
"""

from __future__ import annotations

import numpy as np

from etl.errors import EtlError
from etl.packing.pieces import Packing, whole_examples


def check_lengths(lengths: np.ndarray, *, seq_len: int) -> np.ndarray:
    """(N,) int64 copy of ``lengths`` after checking S >= 1 and every length >= 1.

    Raises:
        EtlError: on a non-1-D array, ``seq_len`` < 1 or a length < 1.
    """
    if int(seq_len) < 1:
        raise EtlError(f"seq_len must be at least 1, got {seq_len}")
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise EtlError(f"lengths must be a 1-D array of token counts, got shape {arr.shape}")
    arr = arr.astype(np.int64)
    bad = np.flatnonzero(arr < 1)
    if len(bad):
        raise EtlError(
            f"{len(bad)} example(s) have no tokens (first: example {int(bad[0])}, length "
            f"{int(arr[bad[0]])}); drop empty examples before packing"
        )
    return arr


def _loop(lengths: np.ndarray, seq_len: int, best: bool, max_docs: int | None) -> Packing:
    clipped = np.minimum(check_lengths(lengths, seq_len=seq_len), seq_len)
    order = np.argsort(-clipped, kind="stable")
    caps: list[int] = []
    docs: list[int] = []
    bins = np.zeros(len(clipped), dtype=np.int64)
    for i in order:
        n = int(clipped[i])
        fits = [b for b in range(len(caps)) if caps[b] >= n and (max_docs is None or docs[b] < max_docs)]
        if not fits:
            caps.append(seq_len)
            docs.append(0)
            b = len(caps) - 1
        else:
            b = min(fits, key=lambda k: (caps[k], k)) if best else fits[0]
        caps[b] -= n
        docs[b] += 1
        bins[i] = b
    return whole_examples(bins, clipped, len(caps))


def bfd(lengths: np.ndarray, *, seq_len: int, seed: int = 0, buffer_docs: int | None = None,
        max_docs_per_bin: int | None = None) -> Packing:
    """Best-fit decreasing (first version)."""
    del seed, buffer_docs
    return _loop(lengths, seq_len, True, max_docs_per_bin)


def ffd(lengths: np.ndarray, *, seq_len: int, seed: int = 0, buffer_docs: int | None = None,
        max_docs_per_bin: int | None = None) -> Packing:
    """First-fit decreasing (first version)."""
    del seed, buffer_docs
    return _loop(lengths, seq_len, False, max_docs_per_bin)
