"""numpy batches -> torch tensors on the training device (pinned memory + non-blocking on CUDA).

`TorchCollate` is the picklable ``collate_fn`` handed to DataLoader workers: it runs the numpy
collate in the worker and returns zero-copy tensors, so the main process only moves them.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from etl.loader.collate import collate
from etl.loader.collate_packed import collate_packed
from etl.loader.images import VisionBatch
from etl.ragged import PackedBatch, Ragged


def resolve_device(device: str | torch.device) -> torch.device:
    """``device`` as a torch.device; asking for CUDA without CUDA warns and gives the CPU."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        warnings.warn("CUDA is not available: loading batches to the CPU instead", stacklevel=2)
        return torch.device("cpu")
    return dev


def to_torch(batch: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Wrap every array as a tensor without copying (``torch.from_numpy``)."""
    return {k: torch.from_numpy(v) for k, v in batch.items()}


def to_device(
    batch: Mapping[str, torch.Tensor], device: torch.device, *, pin: bool | None = None
) -> dict[str, torch.Tensor]:
    """Move a batch to ``device``; on CUDA, pin host memory so the copy can overlap compute.

    Args:
        batch: CPU tensors.
        device: target device.
        pin: pin before copying; None pins exactly when the target is CUDA and a tensor is not
            already pinned (DataLoader(pin_memory=True) pins in its own thread).

    Returns:
        The tensors on ``device`` (the same objects when it is the CPU).
    """
    if device.type == "cpu":
        return dict(batch)
    out = {}
    for key, tensor in batch.items():
        if pin if pin is not None else not tensor.is_pinned():
            tensor = tensor.pin_memory()
        out[key] = tensor.to(device, non_blocking=True)
    return out


@dataclass(frozen=True)
class TorchCollate:
    """``collate_fn`` for DataLoader: numpy collate by strategy name, then tensors.

    Attributes:
        strategy: key of `etl.loader.collate.COLLATE_FNS`.
        options: keyword arguments of that collate function (seq_len, pad_id, ...).
    """

    strategy: str = "fixed"  # "packed" for a PackedBatch (etl.loader.collate_packed)
    options: dict[str, Any] = field(default_factory=dict)

    def __call__(
        self, batch: Ragged | PackedBatch | VisionBatch | Sequence[Mapping[str, np.ndarray]]
    ) -> dict[str, torch.Tensor]:
        if isinstance(batch, VisionBatch):  # the tokens' batch plus pixel_values, image_grid_thw
            return self(batch.batch) | to_torch(batch.arrays())
        if isinstance(batch, PackedBatch):
            return to_torch(collate_packed(batch, **self.options))
        return to_torch(collate(batch, strategy=self.strategy, **self.options))
