"""`ParquetLoader`: dataset + batch sampler + collate + torch DataLoader, resumable mid-epoch.

DataLoader workers prefetch ahead of the training loop, so the sampler's own position overshoots;
the loader counts the batches it has actually handed out and that count is what it saves.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from etl.errors import EtlError, EtlWarning
from etl.kinds import KINDS
from etl.loader.balance import TokenBalance
from etl.loader.collate import resolve_eos_id, resolve_pad_id
from etl.loader.dataset import ParquetDataset
from etl.loader.device import TorchCollate, resolve_device, to_device
from etl.loader.domain_mix import DomainMix, dataset_domain_mix
from etl.loader.groups import (
    CacheOptions,
    DomainWeights,
    LoaderGroups,
    PackOptions,
    PadOptions,
    SamplerOptions,
    resolve_groups,
)
from etl.loader.images import check_cuts
from etl.loader.options import check_keywords, check_unknown, rank_world, resolve_seq_len
from etl.loader.pack_sampler import make_pack_sampler
from etl.loader.pairs.loader import pair_sampler_and_collate
from etl.loader.samplers import EpochSampler, RandomSampler
from etl.packing.index import SPLITTING


class ParquetLoader:
    """Fixed-shape training batches from an ``etl run`` output, deterministic and resumable.

    Iterating yields dicts of tensors on ``device``: ``x``, ``y`` (B, T) int64 (``y`` = -100 where
    not trained), ``loss_mask`` (B, T) aligned to ``y``, ``attention_mask`` (B, T) bool; image data
    adds ``pixel_values`` and ``image_grid_thw`` (`etl.loader.images`, decoded in the workers). As in
    torchdata's ``StatefulDataLoader``, every ``for`` (every ``iter()``) starts a new epoch, so a
    peek (``next(iter(loader))``) then a ``for`` gives a whole epoch; only right after
    `load_state_dict` does it resume the rest of the saved epoch. The parts work alone with
    torch's ``DataLoader(loader.dataset, batch_sampler=loader.sampler, collate_fn=loader.collate_fn)``;
    ``loader.options`` holds the option groups as resolved (`etl.loader.groups.LoaderGroups`).
    Preference pairs and unpaired (KTO) rows (the manifest's ``kind``) batch differently: TRL's
    padded pairs or prefix-shared packed pairs, SFT rows plus ``label`` (`etl.loader.pairs.loader`).

    Args:
        dst: ``etl run`` output directory.
        batch_size: examples (or packs) per batch on this rank (B).
        split: ``train`` or ``val``.
        seq_len: S = T + 1; default the manifest's ``seq_len``.
        seed: base seed; epoch e uses ``seed + e``.
        shuffle: False keeps file order.
        drop_last: drop rows that cannot fill a batch on every rank.
        num_workers: DataLoader worker processes (0: load in the training process).
        device: where batches go; ``cuda`` pins memory and copies without blocking.
        rank: default from torch.distributed when initialized, else 0; world_size likewise 1.
        packing: ``bfd``, ``ffd``, ``sequential``, ``stream`` or `PackOptions` (packer knobs,
            ``target``, boundary and EOS rules, row options): batches of B packed rows of at
            most S tokens (docs/packing.md); `etl pack`'s index is used when it matches
            strategy, S and packer options, else each epoch is packed online with ``seed +
            epoch``. Batches add ``segment_ids``, ``position_ids``, ``cu_seqlens``,
            ``max_seqlen`` and ``segment_trained``.
        collate: padded batches only: ``fixed`` (T = S - 1, the default), ``longest`` (T of the
            batch's longest example) or `PadOptions` (``pad_multiple``, row options: pad_id,
            use_loss_mask, mask_dtype, truncation, min_tokens, loss_weight).
        sampler: ``epoch`` (each row once an epoch), ``random`` (with replacement; not with
            packing) or `SamplerOptions` (``shuffle_window``, ``num_batches``).
        balance: deal every step's B x world_size rows (or packs) to ranks so each rank gets B
            of them and nearly the same real tokens: True (``swap``), a dealer name or
            `TokenBalance` (``window``: steps regrouped first, default 8; docs/training.md "Token-balanced
            ranks"). Off by default: rank r takes every W-th row.
        domains: `DomainWeights` or a dict ``{domain: weight}``: each epoch still has
            len(dataset) examples, domain d's share w_d / sum(w) exactly up to rounding (docs/training.md
            "Domain weights"); with packing, packed online (the index holds every row once).
        cache: `CacheOptions`: decoded row groups kept per worker (``row_groups``, ``mb``).

    Raises:
        TypeError: a keyword it does not take, named with the keywords it does.
    """

    def __init__(
        self,
        dst: str | os.PathLike[str],
        *,
        batch_size: int,
        split: str = "train",
        seq_len: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
        num_workers: int = 0,
        device: str | torch.device = "cpu",
        rank: int | None = None,
        world_size: int | None = None,
        packing: str | PackOptions | None = None,
        collate: str | PadOptions | None = None,
        sampler: str | SamplerOptions = "epoch",
        balance: bool | str | TokenBalance | None = None,
        domains: Mapping[str, float] | DomainWeights | None = None,
        cache: CacheOptions | None = None,
        **unknown: Any,
    ):
        check_unknown(unknown, ParquetLoader)
        check_keywords({"batch_size": batch_size, "seq_len": seq_len, "seed": seed, "num_workers": num_workers,
                        "rank": rank, "world_size": world_size, "shuffle": shuffle, "drop_last": drop_last,
                        "split": split})
        given = {"packing": packing, "collate": collate, "sampler": sampler, "balance": balance,
                 "domains": domains, "cache": cache}
        self.options: LoaderGroups = resolve_groups(**given)
        rows, pack, cache_ = self.options.rows, self.options.packing, self.options.cache
        window = self.options.sampler.window
        self.dataset = ParquetDataset(
            dst, split=split, min_tokens=rows.min_tokens, weights=rows.loss_weight,
            cache_row_groups=max(cache_.row_groups, window), cache_mb=cache_.mb,
        )
        manifest = self.dataset.manifest
        self.seq_len = resolve_seq_len(seq_len, manifest.get("seq_len"), rows.truncation,
                                        splits=pack is not None and (pack.strategy in SPLITTING  # pairs: skipped
                                                                     or KINDS[self.dataset.kind].paired))
        if self.dataset.images is not None:  # no packer or S may cut an image's tokens
            check_cuts(self.dataset.images.image_rows()[self.dataset.global_rows()],
                       self.dataset.example_lengths(), self.seq_len, None if pack is None else pack.strategy)
        self.pad_id = resolve_pad_id(rows.pad_id, manifest)
        self.rank, self.world_size = rank_world(rank, world_size)
        self.skipped_pairs = 0  # packed preference pairs over S, left out (etl.loader.pairs.loader)
        self._collate_given = collate is not None
        self.device = resolve_device(device)
        weights = None if self.options.domains is None else self.options.domains.weights
        common = {"batch_size": batch_size, "seed": seed, "shuffle": shuffle, "drop_last": drop_last,
                  "balance": self.options.balance, "domains": dataset_domain_mix(self.dataset, weights)}
        row_options = {"seq_len": self.seq_len, "pad_id": self.pad_id, "use_loss_mask": rows.use_loss_mask,
                       "mask_dtype": np.float32 if rows.mask_dtype == "float32" else np.bool_}
        self.sampler, self.collate_fn = self._sampler_and_collate(
            window=window, num_workers=num_workers, common=common, row_options=row_options)
        self.num_workers = num_workers
        self.dataloader = DataLoader(
            self.dataset, batch_sampler=self.sampler, collate_fn=self.collate_fn,
            num_workers=num_workers, pin_memory=self.device.type == "cuda",
        )
        self.epoch, self.position = 0, 0
        # `_resume`: the next iter() continues (epoch, position) (set by load_state_dict);
        # `_live`: the newest iterator has not finished; `_iterators`: how many were made.
        self._resume, self._live, self._iterators = False, False, 0

    def _sampler_and_collate(self, *, window: int, num_workers: int, common: dict[str, Any],
                             row_options: dict[str, Any]) -> tuple[Any, TorchCollate]:
        """The batch sampler and collate function of the chosen mode: padded rows or packs."""
        rows, pack = self.options.rows, self.options.packing
        if self.dataset.pairs:  # preference pairs or unpaired completions
            return pair_sampler_and_collate(self, window=window, num_workers=num_workers, common=common,
                                            row_options=row_options, collate_given=self._collate_given)
        if pack is None:
            assert isinstance(rows, PadOptions)
            return self._make_sampler(window=window, num_workers=num_workers, **common), TorchCollate(
                rows.strategy, {**row_options, "pad_multiple": rows.multiple, "truncation": rows.truncation})
        sampler = make_pack_sampler(
            self.dataset, strategy=pack.strategy, seq_len=self.seq_len, options=pack.packer_options,
            blocks=self.dataset.row_groups if window and common["shuffle"] else 0, mix=max(window, 1),
            truncation=pack.truncation, rank=self.rank, world_size=self.world_size, **common,
        )
        return sampler, TorchCollate("packed", {
            **row_options, "target": pack.target, "mask_boundary_loss": pack.mask_boundary_loss,
            "train_on_eos": pack.train_on_eos, "eos_id": resolve_eos_id(pack.eos_id, self.dataset.manifest)})

    def _make_sampler(
        self,
        *,
        batch_size: int,
        seed: int,
        shuffle: bool,
        drop_last: bool,
        window: int,
        num_workers: int,
        balance: TokenBalance | None,
        domains: DomainMix | None,
    ) -> EpochSampler | RandomSampler:
        """The row sampler of `SamplerOptions` with this loader's rank, world size and costs."""
        common = {"batch_size": batch_size, "seed": seed, "rank": self.rank, "balance": balance,
                  "domains": domains, "world_size": self.world_size}
        if balance is not None:  # a row's real tokens: it is cut to S
            common["costs"] = np.minimum(self.dataset.example_lengths(), self.seq_len)
        if self.options.sampler.strategy == "random":
            return RandomSampler(len(self.dataset), num_batches=self.options.sampler.num_batches, **common)
        return EpochSampler(
            len(self.dataset),
            shuffle=shuffle,
            drop_last=drop_last,
            num_workers=num_workers,
            # Row groups as shuffle blocks: a window of `window` groups fits the cache.
            blocks=self.dataset.row_groups if window and shuffle else 0,
            mix=max(window, 1),
            **common,
        )

    def _next_epoch(self) -> int:
        """The epoch a new iter() runs: the next one after a partial epoch (a peek, a break),
        except right after `load_state_dict`, which resumes the saved one."""
        return self.epoch + 1 if self.position and not self._resume else self.epoch

    def __len__(self) -> int:
        """Batches in the epoch in progress, else in the one the next ``for`` starts (on this
        rank; the same on every rank). Online packing may give each epoch a few packs more or less."""
        return len(self.sampler.batches(self.epoch if self._live else self._next_epoch()))

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        """A new epoch (torchdata's StatefulDataLoader semantics), or the rest of the loaded one."""
        epoch = self._next_epoch()
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0
        self._resume, self._live = False, True
        self._iterators += 1
        return self._epoch(self._iterators)

    def _epoch(self, number: int) -> Iterator[dict[str, torch.Tensor]]:
        """Yield the batches of the current epoch from ``position`` on; ``number`` is this
        iterator's: an older one (replaced by a newer iter()) stops with an error."""
        # Rewind the sampler to what the training loop has consumed: workers may have prefetched
        # batches that were never delivered (a `break`, or a resume).
        self.sampler.epoch, self.sampler.position = self.epoch, self.position
        try:
            for batch in self.dataloader:
                if number != self._iterators:
                    raise EtlError("this iterator of the loader was replaced by a newer iter(loader) "
                                   "(a new `for` starts a new epoch); keep using the newest one")
                self.position += 1
                yield to_device(batch, self.device)
            self.epoch, self.position = self.epoch + 1, 0
        finally:
            self._live = self._live and number != self._iterators

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch on the next iteration."""
        self.epoch, self.position, self._resume = int(epoch), 0, False

    def _data(self) -> dict[str, Any]:
        """What the batches are made of: the split's parts (a digest of their manifest entries),
        the rows used, and the options that shape a batch. A resume must find all of it equal."""
        ds, collate = self.dataset, self.collate_fn
        keys = ("pad_id", "pad_multiple", "truncation", "use_loss_mask", "target", "mask_boundary_loss",
                "train_on_eos", "eos_id")
        shape = {k: collate.options[k] for k in keys if k in collate.options}
        return {"fingerprint": ds.fingerprint, "dst": str(ds.dst), "split": ds.split, "rows": len(ds),
                "seq_len": self.seq_len, "collate": collate.strategy, **shape}

    def state_dict(self) -> dict[str, Any]:
        """What to save in a checkpoint: epoch and batches delivered, the sampler settings, and
        the identity of the data (`load_state_dict` refuses a state from other data)."""
        return {**self.sampler.state_dict(), "epoch": self.epoch, "position": self.position,
                "data": self._data()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at exactly the next batch after the one the saved state had delivered: the
        next iter() (the next ``for``) yields the rest of the saved epoch, the one after it the
        following epoch.

        Raises:
            EtlError: the state was saved on other data (another output or split, a rerun with
                other results, other seq_len or batch shape) or with other sampler settings, or
                its epoch or position is not one this loader can reach (edited or forged).
        """
        if not isinstance(state, Mapping):
            raise EtlError(f"cannot resume from a {type(state).__name__}: pass the dict loader.state_dict() returned")
        saved, now = state.get("data"), self._data()
        if saved is None:
            warnings.warn("this loader state carries no data fingerprint (saved by an older etl); "
                          "resuming without checking it was saved on the same data", EtlWarning, stacklevel=2)
        else:
            differ = [f"{k}: now {now[k]!r}, saved {saved.get(k)!r}" for k in now
                      if k != "dst" and saved.get(k) != now[k]]
            if differ:
                raise EtlError(f"cannot resume: the state was saved on other data ({'; '.join(differ)}); "
                               f"load it with the output and options it was saved with ({saved.get('dst')})")
        self.sampler.load_state_dict(state)
        self.epoch, self.position, self._resume = self.sampler.epoch, self.sampler.position, True
        if self.position >= len(self.sampler.batches(self.epoch)):
            # Saved after the epoch's last batch: the next batch is the next epoch's first, so
            # the resumed loop does not spend an iteration on an empty epoch.
            self.epoch, self.position = self.epoch + 1, 0
