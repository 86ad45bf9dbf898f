"""`EpisodeDataLoader`: fixed-shape ``get_batch(split)`` over the episode export's layout.

``sft_episode`` never crosses an episode boundary: each row is one episode padded or cut to
block_size + 1. ``token_stream`` draws random contiguous windows (nanoGPT-style pretraining).
Sampling and padding are the same code as the Parquet loader (`samplers`, `collate`).
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from etl.columns import SPLITS
from etl.errors import EtlError
from etl.export.episodes import EpisodeSplit, open_split
from etl.export.token_files import read_meta
from etl.export.training_xml import TrainingConfig
from etl.loader.collate import collate_fixed
from etl.loader.device import resolve_device, to_device, to_torch
from etl.loader.orders import epoch_order, random_rows
from etl.ragged import Ragged

# The name it had under etl.loader: users' logging configs that select it keep working.
log = logging.getLogger("etl.loader.episodes")


def _flag(value: bool) -> str:
    return "true" if value else "false"


class EpisodeDataLoader:
    """A GPTEpisodeDataLoader over ``dataset_dir/{train,val}`` of the episode export.

    Args:
        dataset_dir: written by ``etl export DST OUT --format episodes`` (or any tool that writes
            the same files).
        config: a `TrainingConfig`, or a path / XML string holding ``<training>``; None: defaults.
        batch_size: B; default the config's ``<batch_size>``.
        block_size: T; default the config's ``<block_size>``.
        use_loss_mask: default the config's ``<use_loss_mask>`` (true).
        eos_id: the tokenizer's EOS id, the pad id when the config sets none.
        device: ``cpu`` or ``cuda`` (pinned memory + non-blocking copies).
    """

    def __init__(
        self,
        dataset_dir: str | os.PathLike[str],
        config: TrainingConfig | str | os.PathLike[str] | None = None,
        *,
        batch_size: int | None = None,
        block_size: int | None = None,
        use_loss_mask: bool | None = None,
        eos_id: int | None = None,
        device: str | torch.device = "cpu",
    ):
        if config is None or isinstance(config, TrainingConfig):
            self.config = config or TrainingConfig()
        else:
            self.config = TrainingConfig.from_xml(config)
        cfg = self.config
        self.batch_size = int(batch_size or cfg.batch_size or 0)
        self.block_size = int(block_size or cfg.block_size or 0)
        if self.batch_size < 1 or self.block_size < 1:
            raise EtlError("set batch_size and block_size (arguments or <batch_size>/<block_size>)")
        self.use_loss_mask = cfg.use_loss_mask if use_loss_mask is None else use_loss_mask
        self.dataset_dir, self.device = Path(dataset_dir), resolve_device(device)
        self.mode = cfg.dataset_mode
        # batch_sampling_mode applies to sft_episode only; token_stream always draws windows.
        self.sampling = cfg.sampling if self.mode == "sft_episode" else "random"
        self.pad_id = self._pad_id(eos_id)
        self.splits: dict[str, EpisodeSplit] = {}
        self.episode_ids: dict[str, np.ndarray] = {}
        for split in SPLITS:
            if (self.dataset_dir / split).is_dir():
                self._open(split)
        if not self.splits:
            raise EtlError(
                f"{self.dataset_dir} has neither train/ nor val/; run `etl export` first"
            )
        self._cursor = {s: {"epoch": 0, "pos": 0, "started": -1} for s in self.splits}
        self._rngs = {s: np.random.default_rng([cfg.epoch_seed, i]) for i, s in enumerate(SPLITS)}
        self._warned = False
        self._plans: dict[str, tuple[int, np.ndarray]] = {}
        self.last_episode_ids: dict[str, np.ndarray] = {}

    def _pad_id(self, eos_id: int | None) -> int:
        """config pad_token_id, else the tokenizer's EOS, else the export's pad/eot id."""
        meta = read_meta(self.dataset_dir, required=False)
        for value in (self.config.pad_token_id, eos_id, meta.get("pad_id"), meta.get("eot_id")):
            if value is not None:
                return int(value)
        raise EtlError(
            "no pad id: set <pad_token_id> in <training> or pass eos_id=tokenizer.eos_id"
        )

    def _open(self, split: str) -> None:
        data = open_split(self.dataset_dir / split, need_index=self.mode == "sft_episode")
        self.splits[split] = data
        min_tokens = self.config.episode_min_tokens
        if data.index is not None:
            self.episode_ids[split] = np.flatnonzero(data.index[:, 1] >= min_tokens)
        n = data.index.shape[0] if data.index is not None else 0
        kept = len(self.episode_ids.get(split, ()))
        log.info(
            "[EpisodeLoader] init split=%s mode=%s sampling=%s episodes=%d kept=%d "
            "(min_tokens=%d) tokens=%d mask=%s%s",
            split,
            self.mode,
            self.sampling,
            n,
            kept,
            min_tokens,
            data.tokens.shape[0],
            _flag(data.mask is not None),
            f" ({data.mask_note})" if data.mask_note else "",
        )

    def _split(self, split: str) -> EpisodeSplit:
        if split not in self.splits:
            raise EtlError(
                f"split {split!r} is not in {self.dataset_dir}; have {sorted(self.splits)}"
            )
        return self.splits[split]

    def batches_per_epoch(self, split: str) -> int:
        """Batches in one epoch of ``split`` (drop_last: floor(N / B), else ceil)."""
        n = len(self.episode_ids[split])
        if self.sampling == "epoch" and not self.config.epoch_drop_last:
            return -(-n // self.batch_size)
        return max(1, n // self.batch_size) if self.sampling == "random" else n // self.batch_size

    def _log_epoch(self, split: str, epoch: int) -> None:
        c = self._cursor[split]
        if c["started"] == epoch:
            return
        c["started"] = epoch
        log.info(
            "[EpisodeLoader] split=%s epoch=%d episodes=%d batches=%d shuffle=%s drop_last=%s "
            "pad_id=%d mask=%s",
            split,
            epoch,
            len(self.episode_ids[split]),
            self.batches_per_epoch(split),
            _flag(self.config.epoch_shuffle),
            _flag(self.config.epoch_drop_last),
            self.pad_id,
            _flag(self._mask_on(split)),
        )

    def _epoch_plan(self, split: str, epoch: int) -> np.ndarray:
        """The epoch's order (epoch mode) or draws (random mode), computed once per epoch."""
        cached = self._plans.get(split)
        if cached is None or cached[0] != epoch:
            n, cfg = len(self.episode_ids[split]), self.config
            if self.sampling == "epoch":
                plan = epoch_order(n, seed=cfg.epoch_seed, epoch=epoch, shuffle=cfg.epoch_shuffle)
            else:
                plan = random_rows(
                    n,
                    seed=cfg.epoch_seed,
                    epoch=epoch,
                    num_batches=self.batches_per_epoch(split),
                    batch_size=self.batch_size,
                )
            cached = self._plans[split] = (epoch, plan)
        return cached[1]

    def _next_epoch_ids(self, split: str) -> np.ndarray:
        """Next B episode positions in epoch mode, continuing into the next epoch when needed."""
        c, n, b, cfg = (
            self._cursor[split],
            len(self.episode_ids[split]),
            self.batch_size,
            self.config,
        )
        if n == 0 or (cfg.epoch_drop_last and n < b):
            raise EtlError(f"split {split!r} has {n} episodes, fewer than batch_size {b}")
        taken: list[np.ndarray] = []
        need = b
        while need:  # one pass per epoch boundary crossed, not per episode
            usable = n // b * b if cfg.epoch_drop_last else n
            if c["pos"] >= usable:
                c["epoch"], c["pos"] = c["epoch"] + 1, 0
            self._log_epoch(split, c["epoch"])
            order = self._epoch_plan(split, c["epoch"])
            part = order[c["pos"] : c["pos"] + min(need, usable - c["pos"])]
            taken.append(part)
            c["pos"] += len(part)
            need -= len(part)
        return np.concatenate(taken)

    def _next_random_ids(self, split: str) -> np.ndarray:
        c, n = self._cursor[split], len(self.episode_ids[split])
        if n == 0:
            raise EtlError(
                f"split {split!r} has no episodes with >= {self.config.episode_min_tokens} tokens"
            )
        per_epoch = self.batches_per_epoch(split)
        if c["pos"] >= per_epoch:
            c["epoch"], c["pos"] = c["epoch"] + 1, 0
        self._log_epoch(split, c["epoch"])
        draws = self._epoch_plan(split, c["epoch"])
        c["pos"] += 1
        return draws[c["pos"] - 1]

    def _mask_on(self, split: str) -> bool:
        return self.use_loss_mask and self.splits[split].mask is not None

    def get_batch(self, split: str = "train") -> tuple[torch.Tensor, ...]:
        """The next batch of ``split``: ``(x, y)`` or ``(x, y, mask)``, always (B, block_size).

        ``x``, ``y`` are int64 with ``y`` the raw next tokens (pad_id after an episode's end);
        ``mask`` is float32, ``mask[:, i] = mask.bin[start + i + 1]`` and 0 on padding.
        """
        data = self._split(split)
        if self.mode == "token_stream":
            return self._token_stream(split, data)
        if self.sampling == "epoch":
            pos = self._next_epoch_ids(split)
        else:
            pos = self._next_random_ids(split)
        ids = self.episode_ids[split][pos]
        self.last_episode_ids[split] = ids
        use_mask = self._mask_on(split)
        if self.use_loss_mask and not use_mask and not self._warned:
            self._warned = True
            warnings.warn(
                f"no usable mask for {split}: {data.mask_note}; returning (x, y)", stacklevel=2
            )
        batch = Ragged(
            data.tokens,
            data.index[ids, 0].astype(np.int64),  # type: ignore[index]
            data.index[ids, 1].astype(np.int64),
            data.mask if use_mask else None,
        )  # type: ignore[index]
        out = collate_fixed(
            batch,
            seq_len=self.block_size + 1,
            pad_id=self.pad_id,
            use_loss_mask=use_mask,
            mask_dtype=np.float32,
            ignore_index=None,
        )
        keys = ("x", "y", "loss_mask") if use_mask else ("x", "y")
        moved = to_device(to_torch({k: out[k] for k in keys}), self.device)
        return tuple(moved[k] for k in keys)

    def _token_stream(self, split: str, data: EpisodeSplit) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows of block_size + 1 tokens anywhere in the stream (episodes ignored)."""
        span = data.tokens.shape[0] - self.block_size
        if span < 1:
            raise EtlError(f"split {split!r} has {data.tokens.shape[0]} tokens, need > block_size")
        starts = self._rngs[split].integers(0, span, size=self.batch_size, dtype=np.int64)
        window = np.full(self.batch_size, self.block_size + 1, dtype=np.int64)
        out = collate_fixed(
            Ragged(data.tokens, starts, window),
            seq_len=self.block_size + 1,
            pad_id=self.pad_id,
            use_loss_mask=False,
            ignore_index=None,
        )
        moved = to_device(to_torch({"x": out["x"], "y": out["y"]}), self.device)
        return moved["x"], moved["y"]

    def state_dict(self) -> dict[str, Any]:
        """Per-split epoch and position, and the token_stream generators' states."""
        return {
            "cursor": {s: dict(c) for s, c in self._cursor.items()},
            "rngs": {s: r.bit_generator.state for s, r in self._rngs.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly after the batch the saved state had returned."""
        for s, c in state["cursor"].items():
            self._cursor[s] = dict(c)
        for s, st in state["rngs"].items():
            self._rngs[s].bit_generator.state = st
