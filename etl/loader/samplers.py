"""Deterministic, resumable batch samplers: epoch permutations and uniform draws with replacement.

Every order (`etl.loader.orders`) is a pure function of (seed + epoch, rank, world_size):
resuming is recomputing the epoch and skipping the batches already delivered. Used as a
DataLoader ``batch_sampler``.
"""

from __future__ import annotations

import abc
import numbers
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from etl.errors import EtlError
from etl.loader.balance import TokenBalance
from etl.loader.domain_mix import DomainMix
from etl.loader.orders import epoch_order, interleave_for_workers, random_rows, split_for_rank

# Re-exported: the samplers' orders lived here before `etl.loader.orders`.
__all__ = ["SAMPLERS", "EpochSampler", "RandomSampler", "epoch_order", "interleave_for_workers",
           "random_rows", "split_for_rank"]


class _BatchSampler(abc.ABC):
    """Shared state machine: current epoch, batches delivered in it, and resume.

    ``balance`` deals every step's rows to ranks by their tokens, ``costs`` (num_rows,) (a
    `etl.loader.balance.TokenBalance`; None: rank r takes every W-th row). ``domains`` draws
    each epoch's rows by domain weights (`etl.loader.domain_mix`; None: every row alike).
    """

    kind = "base"

    def __init__(
        self,
        num_rows: int,
        *,
        batch_size: int,
        seed: int,
        rank: int,
        world_size: int,
        balance: TokenBalance | None = None,
        costs: np.ndarray | None = None,
        domains: DomainMix | None = None,
    ):
        if batch_size < 1:
            raise EtlError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise EtlError(f"rank {rank} is outside world_size {world_size}")
        if num_rows < 1:
            raise EtlError("the split has no rows; check the split name and min_tokens")
        if costs is not None and len(costs) != num_rows:
            raise EtlError(f"costs must give the tokens of every row ({num_rows}), got {len(costs)}")
        self.num_rows, self.batch_size, self.seed = num_rows, batch_size, seed
        self.rank, self.world_size, self.balance, self.costs = rank, world_size, balance, costs
        if domains is not None and len(domains.codes) != num_rows:
            raise EtlError(f"domains must give the domain of every row ({num_rows}), got {len(domains.codes)}")
        self.domains = domains
        self.epoch, self.position = 0, 0
        self._cache: tuple[int, list[np.ndarray]] | None = None

    @abc.abstractmethod
    def _batches(self, epoch: int) -> list[np.ndarray]:
        """All batches of ``epoch`` for this rank (subclasses define the order)."""

    def batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches of ``epoch``, in the order they are yielded (cached per epoch)."""
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, self._batches(epoch))
        return self._cache[1]

    def __len__(self) -> int:
        return len(self.batches(self.epoch))

    def __iter__(self) -> Iterator[list[int]]:
        """Yield the remaining batches of the current epoch, then move to the next epoch."""
        epoch, batches = self.epoch, self.batches(self.epoch)
        while self.position < len(batches):
            self.position += 1
            yield self._deliver(epoch, batches[self.position - 1])
        self.epoch, self.position = epoch + 1, 0

    def _deliver(self, epoch: int, batch: np.ndarray) -> Any:
        """What the DataLoader hands to ``dataset.__getitems__`` for one batch: its row ids."""
        del epoch
        return batch.tolist()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch (torch's DistributedSampler convention)."""
        self.epoch, self.position = int(epoch), 0

    def _fingerprint(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "num_rows": self.num_rows,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "world_size": self.world_size,
            # None when off, so the states of earlier versions (no such key) still load.
            "balance_tokens": None if self.balance is None else self.balance.fingerprint(),
            "domain_weights": None if self.domains is None else self.domains.fingerprint(),
        }

    def _split(self, order: np.ndarray, *, drop_last: bool, costs: np.ndarray | None = None) -> list[np.ndarray]:
        """This rank's batches of ``order``: `split_for_rank`, or dealt by tokens (``costs`` of
        every id in ``order``, default ``self.costs``) when balancing."""
        common = {"batch_size": self.batch_size, "drop_last": drop_last, "rank": self.rank}
        costs = self.costs if costs is None else costs
        if self.balance is None:
            return split_for_rank(order, world_size=self.world_size, **common)
        if costs is None:
            raise EtlError("token balancing needs the tokens of every row: pass costs=")
        return self.balance.split(order, costs, world_size=self.world_size, **common)

    def state_dict(self) -> dict[str, Any]:
        """Epoch and batches delivered so far, plus the settings a resume must match."""
        return {**self._fingerprint(), "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at exactly the next batch of a `state_dict`.

        Raises:
            EtlError: when the state was saved with different data or sampler settings, or holds
                an epoch or position that no run of these settings reaches.
        """
        if not isinstance(state, Mapping):
            raise EtlError(f"cannot resume from a {type(state).__name__}: pass the dict state_dict() returned")
        mismatch = {
            k: (v, state.get(k)) for k, v in self._fingerprint().items() if state.get(k) != v
        }
        if mismatch:
            detail = ", ".join(f"{k}: now {a}, saved {b}" for k, (a, b) in mismatch.items())
            raise EtlError(f"cannot resume: sampler settings differ ({detail}); use the saved ones")
        epoch, position = _state_count(state, "epoch"), _state_count(state, "position")
        total = len(self.batches(epoch))
        if position > total:
            raise EtlError(f"cannot resume: position {position} is past the {total} batches of epoch {epoch} "
                           "on this rank; load the state_dict() the run saved, unedited")
        self.epoch, self.position = epoch, position


def _state_count(state: Mapping[str, Any], key: str) -> int:
    """``state[key]`` checked: an integer >= 0 (a bool, float or string is a forged state)."""
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise EtlError(f"cannot resume: the state's {key} must be an integer >= 0, got {value!r}; "
                       "load the state_dict() the run saved, unedited")
    return int(value)


class EpochSampler(_BatchSampler):
    """Every row once per epoch (subject to ``drop_last``), seeded by ``seed + epoch``.

    Args:
        num_rows: rows in the split.
        batch_size: rows per batch on this rank.
        seed: base seed.
        shuffle: False keeps file order.
        drop_last: drop the rows that cannot fill a batch on every rank.
        blocks: block shuffling, see `epoch_order` (0 = full shuffle).
        mix: blocks per shuffling window.
        rank: this process's rank; world_size: number of ranks.
        num_workers: DataLoader workers, for `interleave_for_workers` (0 or 1: off).
        balance: deal every step's rows to ranks by tokens (`etl.loader.balance`); None: by
            position. costs: (num_rows,) real tokens of every row, needed with ``balance``.
        domains: draw each epoch's num_rows rows by domain weights (some repeated, some left
            out; `etl.loader.domain_mix.weighted_epoch_rows`), then order them as above.
    """

    kind = "epoch"

    def __init__(
        self,
        num_rows: int,
        *,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
        blocks: int | np.ndarray = 0,
        mix: int = 1,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 0,
        balance: TokenBalance | None = None,
        costs: np.ndarray | None = None,
        domains: DomainMix | None = None,
    ):
        super().__init__(
            num_rows, batch_size=batch_size, seed=seed, rank=rank, world_size=world_size,
            balance=balance, costs=costs, domains=domains,
        )
        self.shuffle, self.drop_last, self.blocks, self.mix = shuffle, drop_last, blocks, mix
        self.num_workers = num_workers
        if drop_last and num_rows < batch_size * world_size:
            raise EtlError(
                f"{num_rows} rows cannot fill one batch of {batch_size} on {world_size} rank(s) "
                "with drop_last; lower batch_size or set drop_last=False"
            )

    def _fingerprint(self) -> dict[str, Any]:
        return {
            **super()._fingerprint(),
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "mix": self.mix,
            "num_workers": self.num_workers,
        }

    def _batches(self, epoch: int) -> list[np.ndarray]:
        options = {"seed": self.seed, "epoch": epoch, "shuffle": self.shuffle, "blocks": self.blocks,
                   "mix": self.mix}
        if self.domains is None:
            order = epoch_order(self.num_rows, **options)
        else:  # the epoch's weighted rows (as many as num_rows), ordered the same way
            order = self.domains.epoch_order(**options)
        batches = self._split(order, drop_last=self.drop_last)
        return [batches[i] for i in interleave_for_workers(len(batches), self.num_workers)]


class RandomSampler(_BatchSampler):
    """Uniform draws with replacement; an "epoch" is ``num_batches`` batches (default N // (B*W)).

    Args:
        num_rows: rows in the split.
        batch_size: rows per batch on this rank.
        seed: base seed (the epoch's draws use ``seed + epoch``).
        num_batches: batches per epoch.
        rank: this process's rank; world_size: number of ranks.
        balance, costs: token balancing, as in `EpochSampler` (a step's draws, dealt by tokens).
        domains: draw row i with chance w_d / (n_d * sum(w)), d its domain
            (`etl.loader.domain_mix.weighted_random_rows`); None: uniformly.
    """

    kind = "random"

    def __init__(
        self,
        num_rows: int,
        *,
        batch_size: int,
        seed: int = 0,
        num_batches: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        balance: TokenBalance | None = None,
        costs: np.ndarray | None = None,
        domains: DomainMix | None = None,
    ):
        super().__init__(
            num_rows, batch_size=batch_size, seed=seed, rank=rank, world_size=world_size,
            balance=balance, costs=costs, domains=domains,
        )
        self.num_batches = num_batches or max(1, num_rows // (batch_size * world_size))

    def _fingerprint(self) -> dict[str, Any]:
        return {**super()._fingerprint(), "num_batches": self.num_batches}

    def _batches(self, epoch: int) -> list[np.ndarray]:
        options = {"seed": self.seed, "epoch": epoch, "num_batches": self.num_batches,
                   "batch_size": self.batch_size, "rank": None if self.balance else self.rank,
                   "world_size": self.world_size}
        if self.domains is None:
            draws = random_rows(self.num_rows, **options)
        else:
            draws = self.domains.random_rows(**options)
        return self._split(draws.ravel(), drop_last=True) if self.balance else list(draws)


SAMPLERS: dict[str, type[_BatchSampler]] = {"epoch": EpochSampler, "random": RandomSampler}
