"""How much of each source a mixture keeps, and which records: pure numpy over per-source totals
and per-record sizes (a few numbers per example, after the sources are tokenized).

`TOTALS` sizes a weighted mixture from the sources' units (tokens or examples) before mixing;
`copies` then turns one source's target into a copy count per record by a seeded draw order, so
the realised units miss the target by less than one record.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def _total_sum(units: np.ndarray, shares: np.ndarray) -> float:
    """The sources' own total (Mosaic's default epoch size): the output is as large as the input,
    reshaped to the shares; sources above their share are down-sampled, those below repeated."""
    return float(units.sum())


def _total_first_exhausted(units: np.ndarray, shares: np.ndarray) -> float:
    """The largest total in which no source repeats (HF `interleave_datasets`' first_exhausted):
    exact shares with every record used at most once; the other sources lose records."""
    return float(np.min(units / shares))


def _total_all_exhausted(units: np.ndarray, shares: np.ndarray) -> float:
    """The smallest total that uses every record of every source (HF's all_exhausted): nothing is
    lost; the sources small for their share are repeated."""
    return float(np.max(units / shares))


TOTALS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "sum": _total_sum,
    "first_exhausted": _total_first_exhausted,
    "all_exhausted": _total_all_exhausted,
}


def source_targets(
    units: np.ndarray, *, weights: np.ndarray | None, epochs: np.ndarray, total: str
) -> tuple[np.ndarray, np.ndarray]:
    """(target units per source, requested share per source).

    units: (S,) each source's tokens or examples before mixing (> 0 where it has any).
    weights: (S,) relative weights, or None: each source is repeated `epochs` times.
    epochs: (S,) repeat factors; with weights, the most a source may be repeated (inf: no cap).
    A source with no units gets 0 whatever its share (the others keep theirs).
    """
    units = units.astype(np.float64)
    if weights is None:
        targets = units * epochs
        return targets, _shares(targets)
    shares = _shares(np.where(units > 0, weights, 0.0))
    live = shares > 0
    if not live.any():
        return np.zeros_like(units), shares
    size = TOTALS[total](units[live], shares[live])
    cap = np.where(np.isinf(epochs), np.inf, units * np.where(np.isinf(epochs), 1.0, epochs))
    return np.minimum(shares * size, cap), shares


def _shares(values: np.ndarray) -> np.ndarray:
    if len(values) and values.max() > np.finfo(np.float64).max / len(values):
        values = values / values.max()  # weights near 1e308 overflow their sum to inf: every share 0
    total = values.sum()
    return values / total if total > 0 else np.zeros_like(values, dtype=np.float64)


def copies(units: np.ndarray, draws: np.ndarray, target: float) -> np.ndarray:
    """Copies of each record (int32, (N,)) so that sum(copies * units) is nearest `target`.

    Every record is taken floor(target / total) times; the rest of the target is filled by whole
    records in the order of `draws` (a seeded uniform draw per record: the smallest go first),
    stopping at the prefix whose units are nearest the rest. The error is under one record's units.
    """
    n = len(units)
    out = np.zeros(n, dtype=np.int32)
    total = float(units.sum())
    if n == 0 or total <= 0 or target <= 0:
        return out
    whole = int(target // total)
    rest = target - whole * total
    order = np.lexsort((np.arange(n), draws))  # ties (never, with MD5 draws) by record order
    cum = np.cumsum(units[order], dtype=np.float64)
    take = int(np.searchsorted(cum, rest))
    short = cum[take - 1] if take > 0 else 0.0
    if take < n and cum[take] - rest < rest - short:
        take += 1  # one more record lands nearer the target than stopping short
    out[:] = whole
    out[order[:take]] += 1
    return out
