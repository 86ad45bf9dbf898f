"""KTO on etl's unpaired rows: each completion's log-prob sum, and TRL's KTO loss.

`unpaired_logps` sums the log-probabilities of every example's trained completion tokens from
the logits of an unpaired batch (padded: one example a row; packed: one per segment), and of the
mismatched rows padded batches carry for KTO's reference point (``kl_x``: each prompt with the
previous row's completion, TRL's ``KL_completion_ids``). `kto_loss` is TRL 1.16's
``KTOTrainer`` loss (``loss_type="kto"``) on those sums, as a function.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from etl.columns import LABEL
from etl.errors import EtlError
from etl.train.dpo import check_positive
from etl.train.loss import example_losses, token_losses

# The mismatched rows of a padded unpaired batch (`etl.loader.pairs.collate.collate_unpaired`).
KL_PREFIX = "kl_"


def unpaired_logps(logits: torch.Tensor, batch: Mapping[str, Any], *, kl: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probs of each example's trained completion tokens, and its label.

    Args:
        logits: (B, T, V) logits for the batch's ``x`` (``kl``: for ``kl_x``), or the T + 1
            columns of ``model(**hf_inputs(batch, model))`` for a packed batch.
        batch: an unpaired batch of `ParquetLoader` (padded, or packed: one example a segment).
        kl: score the mismatched rows (``kl_x``, ``kl_y``, ``kl_loss_mask``) instead.

    Returns:
        (logps, labels): (N,) float32 sums and (N,) bool labels, N the batch's examples (rows,
        or the segments of packed rows in row order).

    Raises:
        EtlError: a batch without ``label``, or ``kl`` on a batch without mismatched rows.
    """
    if LABEL not in batch:
        raise EtlError(f"no 'label' in the batch (keys: {sorted(batch)}): pass a batch of an unpaired "
                       "(KTO) output, `etl run --input-type unpaired`")
    scored = batch
    if kl:
        if f"{KL_PREFIX}y" not in batch:
            raise EtlError("this batch has no mismatched rows (kl_x, kl_y): padded unpaired batches carry "
                           "them, packed ones do not; pass packing=None, or give kto_loss kl= an estimate")
        scored = {"y": batch[f"{KL_PREFIX}y"], "loss_mask": batch[f"{KL_PREFIX}loss_mask"]}
    sums, _ = example_losses(token_losses(logits, scored), scored)  # (B, K): -log p summed
    labels = torch.as_tensor(batch[LABEL]).to(sums.device).bool()
    if "segment_ids" not in batch:
        return -sums[:, 0], labels
    segments = torch.as_tensor(batch["segment_ids"]).to(sums.device).amax(1, keepdim=True)
    width = min(sums.shape[1], labels.shape[1])
    present = torch.arange(width, device=sums.device) < segments  # (B, K): row b has segment k + 1
    return -sums[:, :width][present], labels[:, :width][present]


def _kl_estimate(kl_logps: torch.Tensor | None, ref_kl_logps: torch.Tensor | None,
                 kl: torch.Tensor | float | None, device: torch.device) -> torch.Tensor:
    """KTO's reference point z0, detached and clamped at 0 as TRL does."""
    if (kl_logps is None) != (ref_kl_logps is None) or (kl is not None) == (kl_logps is not None):
        raise EtlError("kto_loss needs KTO's reference point one way: kl_logps= and ref_kl_logps= (the policy's "
                       "and the reference's log-probs of the mismatched rows, unpaired_logps(..., kl=True)), "
                       "or kl= an estimate (a number or tensor; 0 drops the term)")
    if kl is None:
        estimate = (kl_logps - ref_kl_logps).mean()  # type: ignore[operator]
    else:
        estimate = torch.as_tensor(kl, dtype=torch.float32, device=device)
    if estimate.numel() != 1:
        raise EtlError(f"kl= must be one number (the batch's estimate), got shape {tuple(estimate.shape)}")
    return estimate.detach().reshape(()).clamp(min=0)


def kto_loss(
    logps: torch.Tensor, ref_logps: torch.Tensor, labels: torch.Tensor, *,
    kl_logps: torch.Tensor | None = None, ref_kl_logps: torch.Tensor | None = None,
    kl: torch.Tensor | float | None = None, beta: float = 0.1,
    desirable_weight: float = 1.0, undesirable_weight: float = 1.0,
) -> torch.Tensor:
    """TRL 1.16's KTO loss (``KTOTrainer``, ``loss_type="kto"``), mean over the batch's examples.

    With r = logps - ref_logps and z0 the KL estimate: a desirable example (label True) loses
    ``desirable_weight * (1 - sigmoid(beta * (r - z0)))``, an undesirable one
    ``undesirable_weight * (1 - sigmoid(beta * (z0 - r)))``. z0 is never differentiated and
    clamped at 0: from the mismatched rows, ``mean(kl_logps - ref_kl_logps)`` (TRL's estimate),
    or ``kl=`` given (e.g. averaged over ranks, as TRL gathers it; ``kl=0`` drops it).

    Trade-off: the loss alone; TRL's trainer adds its metrics and ``apo_zero_unpaired``. TRL's
    batch-size check applies: with one example a batch the mismatched row is the row itself.

    Args:
        logps, ref_logps: (N,) summed completion log-probs under the policy and the reference.
        labels: (N,) bool, True = desirable.

    Raises:
        ValueError: ``beta`` not finite and > 0, or a weight not finite and >= 0.
        EtlError: shapes that differ, or the KL estimate given both ways or neither.
    """
    beta = check_positive("kto_loss", "beta", beta)
    weights = [check_positive("kto_loss", n, w, zero=True) for n, w in
               (("desirable_weight", desirable_weight), ("undesirable_weight", undesirable_weight))]
    labels = torch.as_tensor(labels, device=logps.device).bool()
    if not (logps.dim() == 1 and logps.shape == ref_logps.shape == labels.shape):
        raise EtlError(f"logps {tuple(logps.shape)}, ref_logps {tuple(ref_logps.shape)} and labels "
                       f"{tuple(labels.shape)} must be the same (N,): one sum and one label an example")
    z0 = _kl_estimate(kl_logps, ref_kl_logps, kl, logps.device)
    ratio = logps - ref_logps
    margin = torch.where(labels, ratio - z0, z0 - ratio)
    weight = torch.full_like(ratio, weights[1]).masked_fill(labels, weights[0])  # in the sums' dtype
    return (weight * (1 - F.sigmoid(beta * margin))).nanmean()
