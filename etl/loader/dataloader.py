"""`ParquetLoader`: dataset + batch sampler + collate + torch DataLoader, resumable mid-epoch.

DataLoader workers prefetch ahead of the training loop, so the sampler's own position overshoots;
the loader counts the batches it has actually handed out and that count is what it saves.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader

from etl.errors import EtlError, EtlWarning
from etl.loader.balance import TokenBalance, token_balance
from etl.loader.collate import COLLATE_FNS, CutSide, resolve_eos_id, resolve_pad_id
from etl.loader.dataset import ParquetDataset
from etl.loader.device import TorchCollate, resolve_device, to_device
from etl.loader.domain_mix import DomainMix, dataset_domain_mix
from etl.loader.options import check_choice, rank_world, resolve_seq_len
from etl.loader.pack_sampler import make_pack_sampler
from etl.loader.samplers import SAMPLERS, EpochSampler, RandomSampler
from etl.packing.index import SPLITTING


class ParquetLoader:
    """Fixed-shape training batches from an ``etl run`` output, deterministic and resumable.

    Iterating yields dicts of tensors on ``device``: ``x``, ``y`` (B, T) int64 (``y`` = -100 where
    not trained), ``loss_mask`` (B, T) aligned to ``y``, ``attention_mask`` (B, T) bool. One
    ``for`` loop is one epoch (or its remainder after a resume); the next loop starts the next.

    Args:
        dst: ``etl run`` output directory.
        batch_size: examples per batch on this rank (B).
        split: ``train`` or ``val``.
        seq_len: S = T + 1; default the manifest's ``seq_len``.
        pad_id: default the manifest's ``pad_id``, else its ``eot_id``.
        sampler: ``epoch`` (each row once per epoch) or ``random`` (with replacement).
        seed: base seed; epoch e uses ``seed + e``.
        shuffle: epoch sampler only; False keeps file order.
        drop_last: epoch sampler only; drop rows that cannot fill a batch on every rank.
        shuffle_window: row groups mixed per shuffling window (block shuffle, see
            `etl.loader.samplers.epoch_order`); None or 0 shuffles the whole split.
        num_batches: random sampler only; batches per epoch.
        collate: ``fixed`` (T = S - 1) or ``longest`` (dynamic, T rounded to ``pad_multiple``).
        pad_multiple: rounding of T for ``longest``.
        use_loss_mask: False trains every real token.
        mask_dtype: ``bool`` or ``float32`` loss mask.
        truncation: ``right`` or ``left``, for examples longer than S.
        min_tokens: skip examples shorter than this.
        num_workers: DataLoader worker processes (0: load in the training process).
        rank: default from torch.distributed when initialized, else 0; world_size likewise 1.
        device: where batches go; ``cuda`` pins memory and copies without blocking.
        cache_row_groups: decoded row groups always kept per worker (at least ``shuffle_window``).
        cache_mb: more row groups are kept while they fit in this budget (per worker).
        weights: deliver ``loss_weight`` when the data has it; None (default) does so whenever
            the column exists (per-message weights are part of the data), False ignores it.
        packing: ``bfd``, ``ffd``, ``sequential`` or ``stream``: batches of B packed rows of at most
            S tokens (README "Packing"); `etl pack`'s index is used when it matches strategy, S
            and ``pack_options``, else each epoch is packed online with ``seed + epoch``. Batches
            add ``segment_ids``, ``position_ids``, ``cu_seqlens``, ``max_seqlen`` and
            ``segment_trained``; ``collate`` and ``min_tokens`` do not apply with an index.
        pack_options: packer keywords (``buffer_docs``, ``max_docs_per_bin``).
        target: ``y`` (x/y, shifted here) or ``labels`` (input_ids/labels, the model shifts,
            chomp-style); packed batches only.
        mask_boundary_loss: packed: no label predicts the next document's first token.
        train_on_eos: packed: False sets every label equal to ``eos_id`` to -100.
        eos_id: default the manifest's last ``eos_ids``, else its ``eot_id``.
        balance_tokens: deal every step's B x world_size rows (or packs) to ranks so that each
            rank gets B of them and nearly the same real tokens (`etl.loader.balance`); True is
            ``swap``, or name a key of ``BALANCERS``. Off by default: rank r takes every W-th row.
        balance_window: steps whose rows are regrouped before dealing (default 8); 1 keeps each
            step's rows as drawn (small B on a heavy tail cannot balance then; README
            "Token-balanced ranks").
        domain_weights: ``{domain: weight}``: each epoch still has len(dataset) examples, domain
            d's share w_d / sum(w) exactly up to rounding (its rows repeated or a seeded subset,
            new every epoch; sampler ``random``: row chance w_d / (n_d sum(w))). Domains not
            named are left out; packing packs the weighted rows online, never from `etl pack`'s
            index (it holds every row once). README "Domain weights", `etl.loader.domain_mix`.
    """

    def __init__(
        self,
        dst: str | os.PathLike[str],
        *,
        batch_size: int,
        split: str = "train",
        seq_len: int | None = None,
        pad_id: int | None = None,
        sampler: Literal["epoch", "random"] = "epoch",
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
        shuffle_window: int | None = 8,
        num_batches: int | None = None,
        collate: str = "fixed",
        pad_multiple: int = 64,
        use_loss_mask: bool = True,
        mask_dtype: Literal["bool", "float32"] = "bool",
        truncation: CutSide = "right",
        min_tokens: int = 2,
        num_workers: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        device: str | torch.device = "cpu",
        cache_row_groups: int = 8,
        cache_mb: float = 256,
        weights: bool | None = None,
        packing: str | None = None,
        pack_options: dict[str, Any] | None = None,
        target: Literal["y", "labels"] = "y",
        mask_boundary_loss: bool = True,
        train_on_eos: bool = True,
        eos_id: int | None = None,
        balance_tokens: bool | str = False,
        balance_window: int | None = None,
        domain_weights: dict[str, float] | None = None,
    ):
        check_choice("sampler", sampler, sorted(SAMPLERS))
        check_choice("collate", collate, sorted(COLLATE_FNS))
        check_choice("mask_dtype", mask_dtype, ["bool", "float32"])
        window = shuffle_window or 0
        self.dataset = ParquetDataset(
            dst, split=split, min_tokens=min_tokens, weights=weights,
            cache_row_groups=max(cache_row_groups, window), cache_mb=cache_mb,
        )
        manifest = self.dataset.manifest
        self.seq_len = resolve_seq_len(seq_len, manifest.get("seq_len"), truncation,
                                        splits=packing in SPLITTING)
        self.pad_id = resolve_pad_id(pad_id, manifest)
        self.rank, self.world_size = rank_world(rank, world_size)
        self.device = resolve_device(device)
        common = {"batch_size": batch_size, "seed": seed, "shuffle": shuffle, "drop_last": drop_last,
                  "balance": token_balance(balance_tokens, balance_window),
                  "domains": dataset_domain_mix(self.dataset, domain_weights)}
        if packing is None:
            self.sampler = self._make_sampler(sampler, window=window, num_batches=num_batches,
                                              num_workers=num_workers, **common)
            self.collate_fn = self._make_collate(
                collate, pad_multiple=pad_multiple, use_loss_mask=use_loss_mask,
                truncation=truncation, mask_dtype=mask_dtype,
            )
        else:
            if sampler != "epoch":
                raise EtlError("packing works with sampler='epoch' (every pack once per epoch)")
            self._make_packed(
                packing, pack_options=pack_options, window=window, truncation=truncation,
                collate_options={"use_loss_mask": use_loss_mask, "target": target,
                                 "mask_dtype": np.float32 if mask_dtype == "float32" else np.bool_,
                                 "mask_boundary_loss": mask_boundary_loss, "train_on_eos": train_on_eos,
                                 "eos_id": resolve_eos_id(eos_id, manifest)},
                **common,
            )
        self.num_workers = num_workers
        self.dataloader = DataLoader(
            self.dataset, batch_sampler=self.sampler, collate_fn=self.collate_fn,
            num_workers=num_workers, pin_memory=self.device.type == "cuda",
        )
        self.epoch, self.position = 0, 0

    def _make_packed(
        self,
        strategy: str,
        *,
        pack_options: dict[str, Any] | None,
        window: int,
        truncation: CutSide,
        collate_options: dict[str, Any],
        **common: Any,
    ) -> None:
        """Sampler of packs (`make_pack_sampler`) and the packed collate with this loader's S."""
        check_choice("target", collate_options["target"], ["labels", "y"])
        self.sampler = make_pack_sampler(
            self.dataset, strategy=strategy, seq_len=self.seq_len, options=pack_options,
            blocks=self.dataset.row_groups if window and common["shuffle"] else 0, mix=max(window, 1),
            truncation=truncation, rank=self.rank, world_size=self.world_size, **common,
        )
        self.collate_fn = TorchCollate(
            "packed", {"seq_len": self.seq_len, "pad_id": self.pad_id, **collate_options}
        )

    def _make_collate(
        self,
        strategy: str,
        *,
        pad_multiple: int,
        use_loss_mask: bool,
        truncation: CutSide,
        mask_dtype: str,
    ) -> TorchCollate:
        """The batch builder: `strategy` from COLLATE_FNS with this loader's S and pad id."""
        options = {
            "seq_len": self.seq_len,
            "pad_id": self.pad_id,
            "pad_multiple": pad_multiple,
            "use_loss_mask": use_loss_mask,
            "truncation": truncation,
            "mask_dtype": np.float32 if mask_dtype == "float32" else np.bool_,
        }
        return TorchCollate(strategy, options)

    def _make_sampler(
        self,
        kind: str,
        *,
        batch_size: int,
        seed: int,
        shuffle: bool,
        drop_last: bool,
        window: int,
        num_batches: int | None,
        num_workers: int,
        balance: TokenBalance | None,
        domains: DomainMix | None,
    ) -> EpochSampler | RandomSampler:
        common = {"batch_size": batch_size, "seed": seed, "rank": self.rank, "balance": balance,
                  "domains": domains}
        common["world_size"] = self.world_size
        if balance is not None:  # a row's real tokens: it is cut to S
            common["costs"] = np.minimum(self.dataset.example_lengths(), self.seq_len)
        if kind == "random":
            return RandomSampler(len(self.dataset), num_batches=num_batches, **common)
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

    def __len__(self) -> int:
        """Batches in the current epoch on this rank (same on every rank)."""
        return len(self.sampler.batches(self.epoch))

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        # Rewind the sampler to what the training loop has consumed: workers may have prefetched
        # batches that were never delivered (a `break`, or a resume).
        self.sampler.epoch, self.sampler.position = self.epoch, self.position
        for batch in self.dataloader:
            self.position += 1
            yield to_device(batch, self.device)
        self.epoch, self.position = self.epoch + 1, 0

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch on the next iteration."""
        self.epoch, self.position = int(epoch), 0

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
        """Resume at exactly the next batch after the one the saved state had delivered.

        Raises:
            EtlError: the state was saved on other data (another output or split, a rerun with
                other results, other seq_len or batch shape) or with other sampler settings.
        """
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
        self.epoch, self.position = self.sampler.epoch, self.sampler.position
        if self.position >= len(self.sampler.batches(self.epoch)):
            # Saved after the epoch's last batch: the next batch is the next epoch's first, so
            # the resumed loop does not spend an iteration on an empty epoch.
            self.epoch, self.position = self.epoch + 1, 0
