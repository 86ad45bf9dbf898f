"""Batches of packs: each epoch's packing (online, from ``seed + epoch``) or `etl pack`'s index.

The sampler owns the packing, a pure function of (seed + epoch, strategy, S), so DataLoader
workers share no state: a batch is delivered as a `PackRequest` (the pieces of its B packs) and
the dataset turns it into a `PackedBatch`. Resume and rank sharding work as for rows, by packs.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from etl.columns import ID
from etl.errors import EtlError, EtlWarning
from etl.loader.balance import TokenBalance
from etl.loader.dataset import ParquetDataset
from etl.loader.domain_mix import DomainMix, take_turns
from etl.loader.orders import epoch_order
from etl.loader.pack_request import PackRequest
from etl.loader.samplers import _BatchSampler
from etl.output.parts import open_part
from etl.packing.index import SPLITTING, PackIndex, stream_turns
from etl.packing.index_io import read_pack_index
from etl.packing.pieces import Packing, keep_end
from etl.packing.registry import PACKERS, pack
from etl.packing.turn_spans import TurnSpans


def _request_for(packing: Packing, packs: np.ndarray, doc_rows: np.ndarray | None) -> PackRequest:
    """The pieces of ``packs`` (in that order); ``doc_rows`` maps their docs to global rows
    (None: the docs are global rows already, as in a pack index)."""
    sub = packing.take_packs(packs)
    return PackRequest(
        rows=sub.doc if doc_rows is None else doc_rows[sub.doc], start=sub.start, length=sub.length, row=sub.pack,
        segment=sub.segments(), num_rows=len(packs), trained=sub.trained,
    )


def _online_packing(
    lengths: np.ndarray,
    *,
    strategy: str,
    seq_len: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    blocks: int | np.ndarray = 0,
    mix: int = 1,
    truncation: str = "right",
    options: dict[str, Any] | None = None,
    turns: TurnSpans | None = None,
    order: np.ndarray | None = None,
) -> Packing:
    """Shuffle the examples with ``seed + epoch`` (as `epoch_order` does), then pack them.

    Args:
        turns: the examples' turn spans, numbered like ``lengths`` (the stream packer's input).
        order: the epoch's rows in packing order instead, repeats allowed (domain weights,
            `etl.loader.domain_mix.DomainMix.epoch_order`); shuffle, blocks and mix then unused.

    Returns:
        A `Packing` whose ``doc`` indexes ``lengths`` (the dataset's rows); with ``order``, it
        numbers the positions of ``order`` instead (its row: ``order[doc]``), so two copies of
        one example packed side by side stay two documents (`Packing.segments`).
    """
    extra = dict(options or {})
    copies = order is not None
    if order is None:
        order = epoch_order(len(lengths), seed=seed, epoch=epoch, shuffle=shuffle, blocks=blocks, mix=mix)
        if turns is not None:
            extra["turns"] = turns.take_docs(order)
    elif turns is not None:
        extra["turns"] = take_turns(turns, order)  # take_docs would keep one copy of a repeat
    fed = lengths[order]
    packing = pack(strategy, fed, seq_len=seq_len, seed=seed + epoch, **extra)
    if not copies:
        packing, fed = replace(packing, doc=order[packing.doc]), lengths
    # Whole-example packers clip an example longer than S; `truncation` picks the end kept.
    return packing if strategy in SPLITTING or truncation != "left" else keep_end(packing, fed)


class PackSampler(_BatchSampler):
    """Batches of ``batch_size`` packs per rank; the pack order is shuffled every epoch.

    Args:
        lengths: (N,) tokens of every dataset row.
        doc_rows: (N,) global row of every dataset row (`ParquetDataset.global_rows`).
        batch_size: packs per batch on this rank.
        strategy: a key of `etl.packing.registry.PACKERS`.
        seq_len: S, the most tokens a pack holds.
        seed: base seed; epoch e packs (online) and orders packs with ``seed + e``.
        index: `etl pack`'s index for this split (same strategy and S), or None to pack online.
        shuffle: False keeps the examples' order and the pack order.
        drop_last: drop the packs that cannot fill a batch on every rank.
        blocks, mix: block shuffling of the examples before online packing (`epoch_order`).
        truncation: which end of an example longer than S a whole-example packer keeps.
        options: packer keywords (``buffer_docs``, ``max_docs_per_bin``).
        rank, world_size: this process among the training ranks.
        balance: deal every step's packs to ranks by their real tokens (`etl.loader.balance`):
            the short packs an epoch ends with do not all land on one rank.
        domains: pack each epoch's domain-weighted rows (`etl.loader.domain_mix`), repeats
            included; online packing only (an index packs every row once).
    """

    kind = "pack"

    def __init__(
        self,
        lengths: np.ndarray,
        *,
        doc_rows: np.ndarray,
        batch_size: int,
        strategy: str,
        seq_len: int,
        seed: int = 0,
        index: PackIndex | None = None,
        shuffle: bool = True,
        drop_last: bool = True,
        blocks: int | np.ndarray = 0,
        mix: int = 1,
        truncation: str = "right",
        options: dict[str, Any] | None = None,
        turns: TurnSpans | None = None,
        rank: int = 0,
        world_size: int = 1,
        balance: TokenBalance | None = None,
        domains: DomainMix | None = None,
    ):
        super().__init__(len(lengths), batch_size=batch_size, seed=seed, rank=rank, world_size=world_size,
                         balance=balance, domains=domains)
        if domains is not None and index is not None:
            raise EtlError("domain weights draw other rows every epoch; a pack index packs every row "
                           "once: pass index=None to pack online")
        self.lengths, self.doc_rows, self.index = lengths, doc_rows, index
        self.strategy, self.seq_len, self.options = strategy, seq_len, dict(options or {})
        self.shuffle, self.drop_last, self.blocks, self.mix = shuffle, drop_last, blocks, mix
        self.truncation, self.turns = truncation, turns
        self._packing: tuple[int, Packing, np.ndarray | None] | None = None

    def _fingerprint(self) -> dict[str, Any]:
        source = "index" if self.index is not None else "online"
        return {**super()._fingerprint(), "strategy": self.strategy, "seq_len": self.seq_len,
                "options": self.options, "source": source, "shuffle": self.shuffle,
                "drop_last": self.drop_last, "truncation": self.truncation}

    def packing(self, epoch: int) -> Packing:
        """The packs of ``epoch`` (``doc`` = dataset row online, global row from an index; with
        domain weights, a position in the epoch's rows: `doc_rows_of`)."""
        if self._packing is None or self._packing[0] != epoch:
            if self.index is not None:
                packing, doc_rows = self.index.packing, None  # an index holds global rows
            else:
                shuffled = {"shuffle": self.shuffle, "blocks": self.blocks, "mix": self.mix}
                order = None if self.domains is None else self.domains.epoch_order(
                    seed=self.seed, epoch=epoch, **shuffled)
                packing = _online_packing(
                    self.lengths, strategy=self.strategy, seq_len=self.seq_len, seed=self.seed,
                    epoch=epoch, truncation=self.truncation, options=self.options, turns=self.turns,
                    order=order, **shuffled,
                )
                doc_rows = self.doc_rows if order is None else self.doc_rows[order]
            self._packing = (epoch, packing, doc_rows)
        return self._packing[1]

    def doc_rows_of(self, epoch: int) -> np.ndarray | None:
        """Global row of every ``doc`` of `packing` (epoch); None: the docs are global rows."""
        self.packing(epoch)
        assert self._packing is not None
        return self._packing[2]

    def _batches(self, epoch: int) -> list[np.ndarray]:
        packing = self.packing(epoch)
        num_packs = packing.num_packs
        if self.drop_last and num_packs < self.batch_size * self.world_size:
            raise EtlError(
                f"{num_packs} packs cannot fill one batch of {self.batch_size} on {self.world_size} "
                "rank(s) with drop_last; lower batch_size or set drop_last=False"
            )
        order = np.arange(num_packs, dtype=np.int64)
        if self.shuffle:  # its own stream: the example shuffle already drew from seed + epoch
            order = np.random.default_rng((self.seed + epoch, 1)).permutation(num_packs)
        costs = packing.pack_tokens() if self.balance else None
        return self._split(order, drop_last=self.drop_last, costs=costs)

    def _deliver(self, epoch: int, batch: np.ndarray) -> PackRequest:
        return _request_for(self.packing(epoch), batch, self.doc_rows_of(epoch))


def make_pack_sampler(
    dataset: ParquetDataset, *, strategy: str, seq_len: int, options: dict[str, Any] | None, **common: Any
) -> PackSampler:
    """A `PackSampler` over ``dataset``: `etl pack`'s index when it was built with this strategy,
    S and options, else online packing every epoch (with a note saying why the index was not used).

    Args:
        dataset: the split's `ParquetDataset`.
        strategy, seq_len, options: what to pack with.
        **common: the other `PackSampler` arguments (batch_size, seed, shuffle, rank, ...).
    """
    if strategy not in PACKERS:
        raise EtlError(f"unknown packing {strategy!r}; choose one of {sorted(PACKERS)}")
    index = read_pack_index(dataset.dst, dataset.split, ids=False)
    options = {k: v for k, v in (options or {}).items() if v is not None}
    wanted = {"strategy": strategy, "seq_len": seq_len, "options": options}
    if index is not None and common.get("domains") is not None:
        warnings.warn(f"{dataset.dst}: domain weights repeat and leave out rows, a different set every "
                      "epoch; the pack index packs every row once, so it is not used: packing online "
                      "every epoch instead", EtlWarning, stacklevel=3)
        index = None
    if index is not None:
        found = {"strategy": index.strategy, "seq_len": index.seq_len, "options": index.options}
        if strategy not in SPLITTING:  # which end of a clipped example survives
            wanted["truncation"], found["truncation"] = common.get("truncation", "right"), index.truncation
        if found != wanted:
            warnings.warn(f"{dataset.dst}: the pack index was built with {found}, not {wanted}; "
                          "packing online every epoch instead", EtlWarning, stacklevel=3)
            index = None
    turns = _dataset_turns(dataset) if strategy == "stream" and index is None else None
    return PackSampler(dataset.example_lengths(), doc_rows=dataset.global_rows(), strategy=strategy,
                       seq_len=seq_len, index=index, options=options, turns=turns, **common)


def _dataset_turns(dataset: ParquetDataset) -> TurnSpans:
    """Turn spans of the dataset's examples for the stream packer, numbered by dataset row."""
    ids = pa.concat_tables([open_part(p).read(columns=[ID]) for p in dataset.files]).column(ID)
    spans = stream_turns(dataset.dst, dataset.split, dataset.manifest, ids)
    return spans.take_docs(dataset.global_rows())
