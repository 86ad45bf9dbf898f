"""`ParquetLoader`'s sampler and collate for the data kinds ``preference`` and ``unpaired``.

The manifest's ``kind`` (absent: ``sft``) picks them. Preference: ``packing=None`` gives TRL's
padded batches (`collate_pairs`), ``packing="bfd"`` (or ``ffd``) the prefix-shared packed layout
(`collate_pairs_packed`); a pair whose P + C + R exceeds S cannot be packed whole, so the loader
leaves it out of the epoch, counts it (``loader.skipped_pairs``) and warns. Unpaired: SFT
batches of prompt + completion, padded or packed, plus ``label``. Domain weights with packed
pairs are refused (the epoch's rows are the pairs that fit, not the domain mix's).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from etl.columns import LABEL
from etl.errors import EtlError, EtlWarning
from etl.kinds import KINDS
from etl.loader.collate_packed import collate_packed
from etl.loader.device import TorchCollate, to_torch
from etl.loader.pack_sampler import PackSampler, make_pack_sampler
from etl.loader.pairs.collate import collate_pairs, collate_unpaired
from etl.loader.pairs.pack import PAIR_PACKERS, LabeledPack, PackedPairs, collate_pairs_packed
from etl.loader.pairs.rows import PairRows

# The loader is typed Any: importing `ParquetLoader` here, even for types, would close an import
# cycle (the loader imports this module); it is read for dataset, options, seq_len, pad_id, rank.
ParquetLoader = Any


@dataclass(frozen=True)
class PairTorchCollate(TorchCollate):
    """``collate_fn`` of the pair kinds: ``strategy`` ``pairs``, ``pairs_packed``, ``unpaired``
    (``options["strategy"]``: SFT's fixed / longest) or ``unpaired_packed``; numpy, then tensors."""

    def __call__(self, batch: Any) -> dict[str, torch.Tensor]:
        if isinstance(batch, PackedPairs):
            return to_torch(collate_pairs_packed(batch, **self.options))
        if isinstance(batch, LabeledPack):
            out = collate_packed(batch.batch, **self.options)
            out[LABEL] = _segment_labels(batch)
            return to_torch(out)
        rows: PairRows | Sequence[Mapping[str, Any]] = batch
        if self.strategy == "pairs":
            return to_torch(collate_pairs(rows, **self.options))
        return to_torch(collate_unpaired(rows, **self.options))


def _segment_labels(pack: LabeledPack) -> np.ndarray:
    """(B, K) bool label of segment k + 1 of each row (False where a row has fewer segments)."""
    batch = pack.batch
    out = np.zeros((batch.num_rows, max(int(batch.segment.max(initial=0)), 1)), dtype=bool)
    out[batch.row, batch.segment - 1] = pack.label
    return out


def pair_sampler_and_collate(
    loader: ParquetLoader, *, window: int, num_workers: int, common: dict[str, Any],
    row_options: dict[str, Any], collate_given: bool,
) -> tuple[Any, PairTorchCollate]:
    """The batch sampler and collate of ``loader`` for its dataset's pair kind.

    Args:
        loader: the loader being built (its dataset, options, seq_len, pad_id, rank).
        window, num_workers, common, row_options: as `ParquetLoader` computes them for SFT.
        collate_given: ``collate=`` was passed: ``fixed`` then pads preference rows to S
            (steady shapes); without it they pad to the longest, as TRL.
    """
    rows, pack, ds = loader.options.rows, loader.options.packing, loader.dataset
    keep_end = rows.truncation == "left"
    if pack is not None and pack.strategy not in PAIR_PACKERS:
        raise EtlError(f"{ds.kind} rows are packed whole: packing must be one of {PAIR_PACKERS}, "
                       f"got {pack.strategy!r}")
    if pack is None:
        sampler = loader._make_sampler(window=window, num_workers=num_workers, **common)
        if not KINDS[ds.kind].paired:  # unpaired completions (KTO)
            multiple = {"pad_multiple": rows.multiple, "truncation": rows.truncation}  # type: ignore[union-attr]
            return sampler, PairTorchCollate("unpaired", {"strategy": rows.strategy, **row_options, **multiple})
        fixed = collate_given and rows.strategy == "fixed"  # type: ignore[union-attr]
        return sampler, PairTorchCollate("pairs", {
            "pad_id": loader.pad_id, "max_length": loader.seq_len, "pad_to_multiple_of": rows.pad_multiple,
            "truncation_mode": "keep_end" if keep_end else "keep_start",
            "width": loader.seq_len if fixed else None})
    blocks = ds.row_groups if window and common["shuffle"] else 0
    if not KINDS[ds.kind].paired:
        sampler = make_pack_sampler(ds, strategy=pack.strategy, seq_len=loader.seq_len, options=pack.packer_options,
                                    blocks=blocks, mix=max(window, 1), truncation=pack.truncation,
                                    rank=loader.rank, world_size=loader.world_size, **common)
        return sampler, PairTorchCollate("unpaired_packed", {
            **row_options, "target": pack.target, "mask_boundary_loss": pack.mask_boundary_loss})
    return _pair_pack_sampler(loader, blocks=blocks, mix=max(window, 1), common=common), PairTorchCollate(
        "pairs_packed", {"seq_len": loader.seq_len, "pad_id": loader.pad_id})


def _pair_pack_sampler(loader: ParquetLoader, *, blocks: Any, mix: int, common: dict[str, Any]) -> PackSampler:
    """A `PackSampler` over the pairs that fit in S whole; the others are counted and skipped."""
    ds, pack, seq_len = loader.dataset, loader.options.packing, loader.seq_len
    assert pack is not None
    if common["domains"] is not None:
        raise EtlError("domain weights are not supported with packed preference pairs; pass packing=None "
                       "(padded pairs take domain weights) or drop domains=")
    lengths = ds.example_lengths()
    fits = lengths <= seq_len
    loader.skipped_pairs = int(len(lengths) - fits.sum())
    if loader.skipped_pairs:
        warnings.warn(f"{loader.skipped_pairs} of {len(lengths)} pairs hold more than seq_len={seq_len} tokens "
                      "as prompt + chosen + rejected and are left out of the packed epochs; pass a larger "
                      "seq_len or packing=None to train them (the manifest's preference.over_shared_seq_len "
                      "counts them at the run's S)", EtlWarning, stacklevel=5)
    if not fits.any():
        raise EtlError(f"no pair fits in seq_len={seq_len} as prompt + chosen + rejected; pass a larger seq_len")
    blocks = blocks[fits] if isinstance(blocks, np.ndarray) else blocks
    return PackSampler(lengths[fits], doc_rows=ds.global_rows()[fits], strategy=pack.strategy, seq_len=seq_len,
                       options=pack.packer_options, blocks=blocks, mix=mix, rank=loader.rank,
                       world_size=loader.world_size, **common)
