"""Loss normalisation: the three rules users ask for, from per-token losses and an etl batch.

Every rule takes ``losses`` (B, T): the loss of the prediction made at each input position,
as `token_losses` computes it (float32 cross-entropy, 0 where nothing is trained). Position i
of a ``y`` batch predicts ``y[:, i]``; of a ``labels`` batch (``target="labels"``: the model
shifts) ``labels[:, i + 1]``, as transformers' ``ForCausalLMLoss`` aligns them. The same
positions carry ``segment_ids`` and ``segment_trained``'s counts, so packed and padded batches
need no other input. Untrained positions are masked again (``torch.where``), so padding
garbage or raw-id labels never reach a sum.

- `token_mean_loss`: the mean over every trained token of the optimizer step, across
  gradient accumulation and ranks (transformers' ``num_items_in_batch``, from `count_trained`);
- `example_mean_loss`: each example's mean over its trained tokens, then the mean over
  examples (a packed row holds several; `count_examples` for a step);
- `sequence_sum_loss`: each example's summed loss, then the mean over examples.

All are vectorized (one ``scatter_add`` per batch for the packed per-example sums, no loop per
example or token) and return 0-d tensors that ``backward()`` directly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from etl.columns import IGNORE_INDEX, LOSS_MASK
from etl.errors import EtlError

Batch = Mapping[str, torch.Tensor]


def _labels(batch: Batch) -> tuple[str, torch.Tensor]:
    """The batch's target and its label tensor: ``y`` (etl shifted) or ``labels`` (model shifts)."""
    for key in ("y", "labels"):
        if key in batch:
            return key, torch.as_tensor(batch[key])
    raise EtlError(
        f"the batch has no 'y' nor 'labels' (keys: {sorted(batch)}); pass a batch of "
        "etl.loader.ParquetLoader, or a dict with 'labels' and optionally 'loss_mask'"
    )


def trained_positions(batch: Batch) -> torch.Tensor:
    """(B, T) bool: input positions whose prediction is trained (``loss_mask``, else labels != -100).

    For a ``labels`` batch the mask is shifted left by one (position i predicts label i + 1);
    its last position predicts nothing.
    """
    key, labels = _labels(batch)
    trained = torch.as_tensor(batch[LOSS_MASK]) != 0 if LOSS_MASK in batch else labels != IGNORE_INDEX
    if key == "y":
        return trained
    return F.pad(trained[:, 1:], (0, 1), value=False)


def token_losses(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """(B, T) cross-entropy of ``logits`` (B, T, V) against the batch's labels, per position, in at
    least float32 (float64 logits stay float64).

    Trade-off: the float32 upcast of (B, T, V) logits costs memory, as transformers' own loss
    does, for sums that do not drift in bf16. Untrained labels (-100) give 0; a ``labels`` batch
    is shifted here (position i against ``labels[:, i + 1]``), so the result lines up with
    ``segment_ids`` for either target. Multiply by ``loss_weight`` first if the data has weights.

    The logits of ``model(**hf_inputs(batch, model))`` are taken as they come: for a ``y`` batch
    `etl.train.hf_inputs` widens the input by one column (x plus y's last label, so the model
    scores every label), and those (B, T + 1, V) logits are cut back to the T that predict ``y``
    (the extra column's own prediction is never a label).
    """
    key, labels = _labels(batch)
    if key == "labels":  # the model's shift: the last position predicts nothing
        labels = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
    num_rows, width = labels.shape
    if key == "y" and logits.dim() == 3 and tuple(logits.shape[:2]) == (num_rows, width + 1):
        logits = logits[:, :width]  # hf_inputs' widened row: logits[i] predicts y[i]
    if logits.shape[:2] != (num_rows, width):
        raise EtlError(
            f"logits {tuple(logits.shape)} do not match the batch's labels {(num_rows, width)}: "
            "pass the model's (B, T, V) logits for this batch's input ids (or T + 1 columns, "
            "the logits of model(**etl.train.hf_inputs(batch, model)))"
        )
    flat = F.cross_entropy(
        logits.flatten(0, 1).to(torch.promote_types(logits.dtype, torch.float32)), labels.flatten(),
        reduction="none", ignore_index=IGNORE_INDEX,
    )
    return flat.view(num_rows, width)


def _example_counts(batch: Batch, trained: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(B, T) int64 segment of each position (None for a padded batch) and (B, K) trained counts."""
    if "segment_ids" not in batch:
        return None, trained.sum(1, keepdim=True)
    seg = torch.as_tensor(batch["segment_ids"]).long()
    if "segment_trained" in batch:
        return seg, torch.as_tensor(batch["segment_trained"])
    # A hand-built packed batch: count here (one host sync for K).
    width = int(seg.max()) + 1 if seg.numel() else 1
    counts = torch.zeros(seg.shape[0], width, dtype=torch.int64, device=seg.device)
    return seg, counts.scatter_add_(1, seg, trained.long())[:, 1:]


def example_losses(losses: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example summed loss and trained count, (B, K) each.

    Packed batches (``segment_ids``: 1..K per document, 0 on padding): column k - 1 is document
    k of the row, its count read from ``segment_trained``; padding falls in a dropped column 0.
    Padded batches: one example per row, K = 1. Columns a row does not use hold 0 and 0.
    One ``scatter_add`` over (B, T): the packed sums cost about one pass over the losses.
    """
    trained = trained_positions(batch)
    if losses.shape != trained.shape:
        raise EtlError(
            f"losses {tuple(losses.shape)} do not match the batch {tuple(trained.shape)}: pass "
            "per-position losses (reduction='none'), e.g. etl.train.token_losses(logits, batch)"
        )
    kept = torch.where(trained, losses, torch.zeros((), dtype=losses.dtype, device=losses.device))
    seg, counts = _example_counts(batch, trained)
    if seg is None:
        return kept.sum(1, keepdim=True), counts
    sums = torch.zeros(seg.shape[0], counts.shape[1] + 1, dtype=losses.dtype, device=losses.device)
    return sums.scatter_add_(1, seg, kept)[:, 1:], counts


def _all_reduce(total: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Sum ``total`` over the ranks when torch.distributed is initialized (else unchanged)."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    return total


def _as_list(batches: Batch | Sequence[Batch]) -> Sequence[Batch]:
    batches = [batches] if isinstance(batches, Mapping) else batches
    if not batches:
        raise EtlError("no batches to count: pass the micro-batches of one optimizer step")
    return batches


def count_trained(
    batches: Batch | Sequence[Batch], *, group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """Trained tokens of an optimizer step: transformers' ``num_items_in_batch``.

    Sums the trained labels of ``batches`` (the step's micro-batches, or one batch), then over
    the ranks of ``group`` (all_reduce SUM) when torch.distributed is initialized. Trade-off: the
    step's micro-batches must be in hand before its first backward (prefetch them, as
    transformers' Trainer does), and one small all_reduce per step. The batches must sit on
    the device the process group communicates on (CUDA for NCCL: the loader's ``device``).
    A transformers model that computes its own loss takes the same count,
    ``model(**kw, num_items_in_batch=n)``; multiply its loss by W as `token_mean_loss` does.

    Returns:
        0-d int64 tensor on the first batch's device.
    """
    total = sum(trained_positions(b).sum() for b in _as_list(batches))
    return _all_reduce(torch.as_tensor(total, dtype=torch.int64), group)


def count_examples(
    batches: Batch | Sequence[Batch], *, group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """Examples with at least one trained token in an optimizer step, summed over ranks.

    The denominator of `example_mean_loss` and `sequence_sum_loss` across gradient accumulation
    and ranks; an example with no trained token is not counted (its mean would be 0 / 0).
    """
    total = sum((_example_counts(b, trained_positions(b))[1] > 0).sum() for b in _as_list(batches))
    return _all_reduce(torch.as_tensor(total, dtype=torch.int64), group)


def _normalise(
    total: torch.Tensor, local: torch.Tensor, count: torch.Tensor | int | None, world_size: int | None
) -> torch.Tensor:
    """``total / local`` (this batch alone) or ``total * W / count`` (a step's global count)."""
    if count is None:
        if world_size is not None:
            raise EtlError(
                "world_size scales a step's global count: pass the count too "
                "(count_trained / count_examples of the step's micro-batches)"
            )
        return total / local.clamp(min=1)
    if world_size is None:
        world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    count = torch.as_tensor(count, device=total.device).clamp(min=1)
    return total * world_size / count


def token_mean_loss(
    losses: torch.Tensor,
    batch: Batch,
    num_items_in_batch: torch.Tensor | int | None = None,
    *,
    world_size: int | None = None,
) -> torch.Tensor:
    """Mean over every trained token: of this batch, or of the whole optimizer step.

    With ``num_items_in_batch`` (`count_trained` of the step's micro-batches, all ranks) the
    result is ``sum(losses) * W / num_items_in_batch``: call ``backward()`` on it for every
    micro-batch without dividing by the accumulation steps, and the gradients DDP or FSDP
    average over the W ranks are exactly those of the mean over the step's trained tokens,
    however the tokens fall on micro-batches and ranks. The factor W undoes DDP's average,
    as transformers' Trainer does (``average_tokens_across_devices``). ``world_size=None`` reads
    torch.distributed's world size when it is initialized (1 otherwise); pass 1 if your
    gradients are summed over ranks, not averaged, and the data-parallel group's size when
    the count's ``group`` is one (tensor-parallel ranks share a batch: count it once). Logging: the per-micro-batch values of one
    rank add up to W x its share; their average over ranks is the step's mean.

    Without a count: the plain mean of this batch (per micro-batch and per rank, the rule
    that gives tokens on light micro-batches or ranks more weight). A step with no trained
    token gives 0, not NaN.
    """
    trained = trained_positions(batch)
    total = torch.where(trained, losses, torch.zeros((), dtype=losses.dtype, device=losses.device)).sum()
    return _normalise(total, trained.sum(), num_items_in_batch, world_size)


def example_mean_loss(
    losses: torch.Tensor,
    batch: Batch,
    num_examples: torch.Tensor | int | None = None,
    *,
    world_size: int | None = None,
) -> torch.Tensor:
    """Each example's mean over its trained tokens, then the mean over examples.

    Every example weighs the same whatever its length (a packed row's documents each count
    once); the trade-off is that a token of a short answer weighs more than one of a long
    answer. Examples with no trained token are left out (not NaN). ``num_examples`` and
    ``world_size`` work as in `token_mean_loss`, with `count_examples` for the step.
    """
    sums, counts = example_losses(losses, batch)
    means = sums / counts.clamp(min=1)  # 0 where nothing is trained
    return _normalise(means.sum(), (counts > 0).sum(), num_examples, world_size)


def sequence_sum_loss(
    losses: torch.Tensor,
    batch: Batch,
    num_sequences: torch.Tensor | int | None = None,
    *,
    world_size: int | None = None,
) -> torch.Tensor:
    """Each example's summed loss (a padded row, or a packed document), then the mean over examples.

    The loss of a sequence's log-likelihood: long answers weigh more, in proportion to their
    trained tokens, and the scale grows with length (mind the learning rate). Examples with no
    trained token are not counted; ``num_sequences`` (`count_examples` of the step) and
    ``world_size`` work as in `token_mean_loss`.
    """
    sums, counts = example_losses(losses, batch)
    return _normalise(sums.sum(), (counts > 0).sum(), num_sequences, world_size)
