"""Domain weights: which rows an epoch delivers so each domain's share of examples is its weight.

Pure numpy functions of (seed + epoch): `weighted_epoch_rows` for the epoch sampler and online
packing (exact shares, rows repeated or left out), `weighted_random_rows` for draws with
replacement (shares in expectation). `DomainMix` carries a split's domain codes and weights.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from etl.errors import EtlError
from etl.loader.orders import epoch_order
from etl.packing.turn_spans import TurnSpans

if TYPE_CHECKING:
    from etl.loader.dataset import ParquetDataset

# Generator stream of the row selection: `epoch_order` draws from ``seed + epoch`` itself and the
# pack order from ``(seed + epoch, 1)``, so the three never share random numbers.
_STREAM = 2


def domain_slots(weights: np.ndarray, *, num_rows: int) -> np.ndarray:
    """Examples each domain gets out of ``num_rows``: ``w_d / sum(w) * N``, largest remainder.

    Every domain gets the floor of its quota, then the ``N - sum(floors)`` domains with the
    largest fractional parts one more (ties: lower code first), so slots sum to exactly N and no
    domain is off its quota by a whole example. A weight of 0 gets no slot.

    Args:
        weights: (D,) finite, >= 0, positive sum (checked, `_check_weights`).
        num_rows: N, the epoch's examples.

    Returns:
        (D,) int64 slots, summing to ``num_rows``.
    """
    w = _check_weights(weights)
    quota = w / w.sum() * num_rows
    slots = np.floor(quota).astype(np.int64)
    extra = num_rows - int(slots.sum())
    frac = np.where(w > 0, quota - slots, -1.0)  # a zero weight never takes a remainder slot
    slots[np.argsort(-frac, kind="stable")[:extra]] += 1
    assert slots.sum() == num_rows and np.all(slots[w == 0] == 0)
    return slots


def _check_weights(weights: np.ndarray) -> np.ndarray:
    """``weights`` as float64 after checking each is finite and >= 0 and their sum positive."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or not np.all(np.isfinite(w)) or np.any(w < 0) or not w.sum() > 0:
        raise EtlError(f"domain weights must be finite numbers >= 0 with a positive sum, got {w.tolist()}")
    return w


def weighted_epoch_rows(domain_codes: np.ndarray, weights: np.ndarray, *, num_rows: int, seed: int) -> np.ndarray:
    """The rows of one weighted epoch: `domain_slots` per domain, filled from its own rows.

    Domain d's slots take a seeded permutation of its rows, then another, ... (a new one per
    cycle) cut where the slots end: upsampled, every row appears floor or ceil(slots / rows)
    times; downsampled, a random subset appears once. Trade-off against drawing rows with
    replacement (`weighted_random_rows`): shares are exact up to rounding and no row repeats
    before every row of its domain has appeared, but the epoch's size is fixed to ``num_rows``.
    Cost: a stable argsort of the codes and one permutation per cycle, ~N + R elements, well
    below the block shuffle that follows (docs/design.md, Measured costs); a loop per domain.

    Args:
        domain_codes: (R,) int domain code (0..D-1) of every dataset row.
        weights: (D,) weight of every code; 0 leaves the domain out.
        num_rows: N, examples in the epoch (usually R: an unweighted epoch's size).
        seed: the generator's seed (``seed + epoch``).

    Returns:
        (num_rows,) int64 dataset rows, grouped by domain code (shuffle them afterwards).

    Raises:
        EtlError: bad weights, or a weighted domain with no row.
    """
    codes, w, counts = _domains(domain_codes, weights)
    slots = domain_slots(w, num_rows=num_rows)
    members, first = np.argsort(codes, kind="stable"), np.cumsum(counts) - counts  # rows by domain
    rng = np.random.default_rng((seed, _STREAM))
    taken = [np.zeros(0, dtype=np.int64)]
    for d in np.flatnonzero(slots):
        rows = members[first[d] : first[d] + counts[d]]
        cycles = -(-int(slots[d]) // rows.size)
        taken.append(rng.permuted(np.tile(rows, (cycles, 1)), axis=1).ravel()[: slots[d]])
    return np.concatenate(taken)


def _domains(domain_codes: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes int64, checked weights, rows per code), refusing a weighted code with no row."""
    codes, w = np.asarray(domain_codes, dtype=np.int64), _check_weights(weights)
    counts = np.bincount(codes, minlength=len(w))
    empty = np.flatnonzero((w > 0) & (counts == 0))
    if empty.size:
        raise EtlError(f"domain codes {empty.tolist()} are weighted but have no row in the data")
    return codes, w, counts


def row_probabilities(domain_codes: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(R,) float64 chance of every row per draw: ``w_d / (n_d * sum(w))`` for a row of domain d."""
    codes, w, counts = _domains(domain_codes, weights)
    per_row = np.divide(w, counts * w.sum(), out=np.zeros_like(w), where=counts > 0)
    return per_row[codes]


def weighted_random_rows(
    domain_codes: np.ndarray,
    weights: np.ndarray,
    *,
    seed: int,
    epoch: int,
    num_batches: int,
    batch_size: int,
    rank: int | None = 0,
    world_size: int = 1,
) -> np.ndarray:
    """`etl.loader.orders.random_rows` with row i drawn with chance `row_probabilities` [i].

    Each draw picks a domain by weight, then a row of it uniformly: two draws per row but no
    search over the rows' CDF, far faster than ``Generator.choice(p=...)``, whose lookups miss
    the cache (docs/design.md, Measured costs). Trade-off against `weighted_epoch_rows`: no
    epoch structure (any number of batches, rows independent), but shares hold only in
    expectation (binomial noise, ~1/sqrt(draws)) and a row may repeat while another of its
    domain is never drawn.

    Returns:
        (num_batches, batch_size) int64 rows; rank None: every rank's, (num_batches, W * B).
    """
    codes, w, counts = _domains(domain_codes, weights)
    members, first = np.argsort(codes, kind="stable"), np.cumsum(counts) - counts
    rng = np.random.default_rng((seed + epoch, _STREAM))
    size = (num_batches, world_size, batch_size)
    # A zero weight is a zero-width step of the CDF: never found; rounding at 1.0 is clipped.
    domain = np.searchsorted(np.cumsum(w) / w.sum(), rng.random(size), side="right")
    domain = np.minimum(domain, np.flatnonzero(w)[-1])
    draws = members[first[domain] + rng.integers(0, counts[domain])]
    return draws.reshape(num_batches, -1) if rank is None else draws[:, rank]


def mixed_order(
    rows: np.ndarray, *, seed: int, epoch: int, shuffle: bool = True, blocks: int | np.ndarray = 0, mix: int = 1
) -> np.ndarray:
    """An epoch's (weighted) rows in sampler order: `epoch_order` over them, blocks kept.

    Args:
        rows: (M,) dataset rows of the epoch, repeats allowed (`weighted_epoch_rows`).
        seed, epoch: the shuffle's generator is seeded with ``seed + epoch``.
        shuffle: False sorts the rows (file order; the epoch's selection is still seeded).
        blocks: 0, an int b (blocks of b consecutive dataset rows) or the (R,) block label of
            every dataset row: a repeated row stays in its row group's window.
        mix: blocks per shuffling window.

    Returns:
        (M,) int64 dataset rows.
    """
    rows = np.asarray(rows, dtype=np.int64)
    if not shuffle:
        return np.sort(rows, kind="stable")
    if isinstance(blocks, (int, np.integer)):
        labels: int | np.ndarray = rows // int(blocks) if blocks > 0 else 0
    else:
        labels = np.asarray(blocks)[rows]
    return rows[epoch_order(len(rows), seed=seed, epoch=epoch, blocks=labels, mix=mix)]


def take_turns(turns: TurnSpans, docs: np.ndarray) -> TurnSpans:
    """`TurnSpans.take_docs` that allows repeats: the turns of ``docs`` in that order, doc k's
    turns renumbered k (``take_docs`` keeps one copy of a repeated example)."""
    docs = np.asarray(docs, dtype=np.int64)
    first = np.searchsorted(turns.doc, docs, side="left")  # turns are sorted by doc, then start
    count = np.searchsorted(turns.doc, docs, side="right") - first
    new = np.repeat(np.arange(len(docs), dtype=np.int64), count)
    offsets = np.cumsum(count) - count
    idx = np.repeat(first - offsets, count) + np.arange(int(count.sum()), dtype=np.int64)
    return TurnSpans(new, turns.start[idx], turns.end[idx], turns.role[idx], turns.header_len[idx])


@dataclass(frozen=True)
class DomainMix:
    """A split's domains and their weights: what the samplers need to draw a weighted epoch.

    Attributes:
        codes: (R,) int64 domain code of every dataset row.
        names: the domain of each code (those with rows in the dataset).
        weights: (D,) float64 weight of each code; 0 for a domain not named.
        requested: the weights as the user named them (the resume fingerprint).
    """

    codes: np.ndarray
    names: tuple[str, ...]
    weights: np.ndarray
    requested: dict[str, float]

    def epoch_rows(self, *, seed: int, epoch: int) -> np.ndarray:
        """(R,) dataset rows of ``epoch``, grouped by domain (`weighted_epoch_rows`)."""
        return weighted_epoch_rows(self.codes, self.weights, num_rows=len(self.codes), seed=seed + epoch)

    def epoch_order(
        self, *, seed: int, epoch: int, shuffle: bool = True, blocks: int | np.ndarray = 0, mix: int = 1
    ) -> np.ndarray:
        """(R,) dataset rows of ``epoch`` in sampler order (`mixed_order` of `epoch_rows`)."""
        rows = self.epoch_rows(seed=seed, epoch=epoch)
        return mixed_order(rows, seed=seed, epoch=epoch, shuffle=shuffle, blocks=blocks, mix=mix)

    def random_rows(self, **draw: Any) -> np.ndarray:
        """`weighted_random_rows` of these rows (``seed``, ``epoch``, ``num_batches``, ...)."""
        return weighted_random_rows(self.codes, self.weights, **draw)

    def fingerprint(self) -> dict[str, float]:
        """What a resume must find equal: the requested weights."""
        return dict(self.requested)


def check_domain_weights(weights: Any) -> dict[str, float]:
    """``{domain: weight}`` as floats sorted by domain, after checking each is finite and >= 0
    and their sum positive.

    Raises:
        EtlError: not a non-empty mapping, a weight that is not a number, or the rule broken.
    """
    if not isinstance(weights, Mapping) or not weights:
        raise EtlError(f"domain weights must be a non-empty dict of domain -> weight, got {weights!r}")
    try:
        requested = {str(k): float(v) for k, v in weights.items()}
    except (TypeError, ValueError):
        raise EtlError(f"domain weights must be numbers, got {dict(weights)!r}") from None
    if not all(math.isfinite(v) and v >= 0 for v in requested.values()) or not sum(requested.values()) > 0:
        raise EtlError(f"domain weights must be finite numbers >= 0 with a positive sum, got {requested}")
    return dict(sorted(requested.items()))


def _make_domain_mix(codes: np.ndarray, names: list[str] | tuple[str, ...], weights: Mapping[str, Any]) -> DomainMix:
    """Check ``weights`` against the domains present and align them with the codes.

    Domains present but not named get weight 0: their rows are left out of every epoch.

    Raises:
        EtlError: not a non-empty mapping, a named domain with no row in the split (the message
            lists those present), or a weight that is not finite and >= 0, or a zero sum.
    """
    requested = check_domain_weights(weights)
    unknown = sorted(k for k in requested if k not in names)
    if unknown:
        raise EtlError(f"domain weights name domains with no example in this split (after min_tokens): {unknown}; "
                       f"domains present: {sorted(names)}")
    aligned = np.array([requested.get(n, 0.0) for n in names], dtype=np.float64)
    return DomainMix(np.asarray(codes, dtype=np.int64), tuple(names), aligned, requested)


def dataset_domain_mix(dataset: ParquetDataset, weights: Mapping[str, Any] | None) -> DomainMix | None:
    """The `DomainMix` of ``dataset`` for ``weights`` (the loader's ``domains``); None off."""
    if weights is None:
        return None
    codes, names = dataset.domain_codes()
    return _make_domain_mix(codes, names, weights)
