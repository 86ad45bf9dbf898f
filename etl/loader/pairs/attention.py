"""Attention for prefix-shared packed pairs (`etl.loader.pairs.pack`).

Rule: a token attends causally inside its own pair only, and a rejected token never to a
chosen one; so chosen sees [prompt, itself], rejected sees [prompt, itself], exactly the keys
it has in TRL's padded rows (prompt + completion). Positions (``position_ids``, rejected
restarting at P) make the relative distances equal too, so RoPE models compute the same
values. Padding (pair 0) attends to earlier padding, so no query row is fully masked (a NaN
softmax). A sliding window, where the model has one, is measured in positions (= the columns of
the padded row), not in columns of the packed row.

Two forms of one rule, as `etl.loader.attention`: `pair_block_mask` (FlexAttention,
block-sparse, for the GPU) and `pair_sdpa_mask` (dense (B, 1, S, S) booleans: S^2 bytes a row,
4 MB at S = 2048; CPU, tests, moderate S). torch is imported here, never by the collate. The
transformers call that uses them is `etl.train.hf.pair_hf_inputs`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from etl.errors import EtlError
from etl.loader.pairs.pack import PART_CHOSEN, PART_REJECTED

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def pair_mask_mod(
    pair_ids: torch.Tensor, part_ids: torch.Tensor, *, position_ids: torch.Tensor | None = None,
    window: int | None = None,
) -> MaskMod:
    """FlexAttention ``mask_mod(b, h, q, kv)``: same pair, kv <= q, not (rejected q, chosen kv),
    and with ``window``, ``position_ids[q] - position_ids[kv] < window``.

    Args:
        pair_ids, part_ids: (B, S) integer tensors of the packed batch.
        position_ids: (B, S) positions; needed with ``window``.
        window: a sliding window in tokens (transformers' ``sliding_window``), None: none.
    """
    if pair_ids.dim() != 2 or pair_ids.shape != part_ids.shape:
        raise EtlError(f"pair_ids and part_ids must be (B, S) tensors of one shape (the packed pair batch's), "
                       f"got {tuple(pair_ids.shape)} and {tuple(part_ids.shape)}")
    if window is not None and position_ids is None:
        raise EtlError("a sliding window is measured in positions: pass position_ids")

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        same = (pair_ids[b, q] == pair_ids[b, kv]) & (kv <= q)
        crossed = (part_ids[b, q] == PART_REJECTED) & (part_ids[b, kv] == PART_CHOSEN)
        keep = same & ~crossed
        if window is not None:
            keep = keep & (position_ids[b, q] - position_ids[b, kv] < window)  # type: ignore[index]
        return keep

    return mask_mod


def pair_block_mask(
    pair_ids: torch.Tensor, part_ids: torch.Tensor, *, position_ids: torch.Tensor | None = None,
    window: int | None = None, block_size: int = 128,
) -> BlockMask:
    """FlexAttention `BlockMask` of `pair_mask_mod`, H broadcast.

    Trade-off: built once per batch on the batch's device (evaluates the mask over B x S x S
    there), then skips every block between pairs; FlexAttention's backward needs CUDA.
    """
    mod = pair_mask_mod(pair_ids, part_ids, position_ids=position_ids, window=window)
    num_rows, width = pair_ids.shape
    return create_block_mask(mod, B=num_rows, H=None, Q_LEN=width, KV_LEN=width, device=pair_ids.device,
                             BLOCK_SIZE=block_size)


def pair_sdpa_mask(
    pair_ids: torch.Tensor, part_ids: torch.Tensor, *, position_ids: torch.Tensor | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Boolean (B, 1, S, S) mask of `pair_mask_mod` for ``scaled_dot_product_attention``
    (True = may attend), computed by broadcasting (no Python loop).

    Trade-off: dense, B x S^2 bytes (128 MB at B = 32, S = 2048) and no skipped work.
    """
    mod = pair_mask_mod(pair_ids, part_ids, position_ids=position_ids, window=window)
    num_rows, width = pair_ids.shape
    b = torch.arange(num_rows, device=pair_ids.device)[:, None, None, None]
    q = torch.arange(width, device=pair_ids.device)[None, None, :, None]
    return mod(b, torch.zeros_like(b), q, q.transpose(2, 3))

