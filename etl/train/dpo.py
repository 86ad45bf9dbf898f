"""Per-pair completion log-probs from a model's logits, for both preference layouts, and DPO's loss.

`completion_logps` gives what TRL's ``DPOTrainer`` sums: for each pair, the log-probability of
its trained chosen tokens and of its trained rejected tokens, each token scored by the logits of
the position that predicts it (t - 1 in TRL's padded rows; ``logits_index`` in the prefix-shared
packed rows, where the first rejected token follows the prompt). Memory: one logsumexp over the
vocabulary per position and a gather, no (B, S, V) log-softmax; half-precision logits are upcast
to float32 first (one (B, S, V) copy: sums of bf16 log-probs lose ~3 digits).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from etl.columns import COMPLETION_MASK, INPUT_IDS
from etl.errors import EtlError
from etl.loader.pairs.pack import LOGITS_INDEX, PAIR_IDS, PART_CHOSEN, PART_IDS, PART_REJECTED


def token_logps(logits: torch.Tensor, input_ids: torch.Tensor, logits_index: torch.Tensor) -> torch.Tensor:
    """(B, S) log p(input_ids[b, t] | the logits at column logits_index[b, t]), in at least float32.

    Args:
        logits: (B, S, V) model outputs.
        input_ids: (B, S) token ids.
        logits_index: (B, S) column of ``logits`` predicting each token (in range).
    """
    dtype = torch.promote_types(logits.dtype, torch.float32)
    rows = torch.arange(logits.shape[0], device=logits.device)[:, None]
    picked = logits[rows, logits_index, input_ids].to(dtype)
    return picked - logits.to(dtype).logsumexp(-1).gather(1, logits_index)


def completion_logps(logits: torch.Tensor, batch: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probs of each pair's trained chosen and rejected tokens.

    Padded batch (`collate_pairs`, 2B rows: chosen then rejected): token t scored by logits
    t - 1 and summed over ``completion_mask[:, 1:]``, as TRL's DPOTrainer (its ``ld_alpha=None``).
    Packed batch (`collate_pairs_packed`): every token scored by the logits at its
    ``logits_index``, summed per pair and part; pairs in layout order (row 0's pair 1, 2, ...,
    then row 1's), the order of `pack_pairs`'s returned index.

    Args:
        logits: (rows, L, V) logits of ``model(**pair_hf_inputs(batch, model))``.
        batch: the batch (tensors or arrays) the logits came from.

    Returns:
        (chosen_logps, rejected_logps): (N,) each, in the logits' dtype promoted to float32.

    Raises:
        EtlError: a batch of neither layout, or logits of another shape.
    """
    device = logits.device
    ids = torch.as_tensor(batch[INPUT_IDS]).to(device).long()
    mask = torch.as_tensor(batch[COMPLETION_MASK]).to(device).bool()
    if logits.shape[:2] != ids.shape:
        raise EtlError(f"logits {tuple(logits.shape)} do not match the batch's input_ids {tuple(ids.shape)}: "
                       "pass the logits of model(**pair_hf_inputs(batch, model))")
    if PAIR_IDS not in batch:  # TRL's rows: [chosen; rejected]
        index = (torch.arange(ids.shape[1], device=device) - 1).clamp(min=0).expand_as(ids)
        logps = token_logps(logits, ids, index).masked_fill(~mask, 0.0)
        sums = logps[:, 1:].sum(1)
        if sums.shape[0] % 2:
            raise EtlError(f"a padded preference batch has 2B rows (chosen, then rejected), got {sums.shape[0]}")
        chosen, rejected = sums.chunk(2)
        return chosen, rejected
    pair = torch.as_tensor(batch[PAIR_IDS]).to(device).long()
    part = torch.as_tensor(batch[PART_IDS]).to(device)
    index = torch.as_tensor(batch[LOGITS_INDEX]).to(device).long()
    logps = token_logps(logits, ids, index).masked_fill(~mask, 0.0)
    per_row = pair.amax(1)
    first = per_row.cumsum(0) - per_row  # global number of each row's first pair
    slot = ((first[:, None] + pair - 1).clamp(min=0) * 2 + (part == PART_REJECTED).long())
    keep = mask & ((part == PART_CHOSEN) | (part == PART_REJECTED))
    total = int(per_row.sum())  # one device sync: the number of pairs sizes the result
    sums = torch.zeros(2 * total, dtype=logps.dtype, device=device)
    sums.index_add_(0, slot.flatten(), logps.masked_fill(~keep, 0.0).flatten())
    return sums[0::2], sums[1::2]


def check_positive(owner: str, name: str, value: Any, *, zero: bool = False) -> float:
    """``value`` as a float, checked finite and > 0 (>= 0 with ``zero``): a negative beta trains
    the policy away from the chosen answers and a NaN one makes every loss NaN, silently."""
    low = ">= 0" if zero else "> 0"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not zero):
        raise ValueError(f"{owner}({name}=...) must be a finite number {low}, got {value!r}"
                         + ("; TRL's default beta is 0.1" if name == "beta" else ""))
    return float(value)


def dpo_loss(
    chosen_logps: torch.Tensor, rejected_logps: torch.Tensor, ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor, *, beta: float = 0.1,
) -> torch.Tensor:
    """Sigmoid DPO loss, mean over pairs: -logsigmoid(beta x ((pc - rc) - (pr - rr))), with
    p/r the policy/reference and c/r chosen/rejected summed log-probs (TRL's ``loss_type="sigmoid"``,
    no label smoothing).

    Trade-off: the plain form for examples and tests; TRL's trainer adds the variants (IPO,
    label smoothing, length normalization).

    Raises:
        ValueError: ``beta`` is not a finite number > 0.
    """
    check_positive("dpo_loss", "beta", beta)
    margin = (chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps)
    return -F.logsigmoid(beta * margin).mean()
