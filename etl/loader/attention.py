"""Attention masks that respect the packing: ``segment_ids`` -> document masks.

A token may attend to an earlier (causal) token of its own document only; padding (segment 0)
attends to padding, so no query row is fully masked (a fully masked softmax row is NaN). With
these masks and `collate_packed`'s reset ``position_ids``, a packed row computes what its
examples would compute alone. Without them it is chomp's stream semantics: attention runs
across documents and only the loss is masked at the boundaries.

Two forms, same rule: `document_block_mask` for FlexAttention (block-sparse: skips the blocks
between documents, O(B x (T / block)^2) metadata, fused under torch.compile) and
`document_sdpa_mask` for ``scaled_dot_product_attention`` (dense (B, 1, T, T) booleans: 4 MB
per row at T = 2048, so for small T and tests). torch is imported here, never by collate.
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from etl.errors import EtlError


def _check_segments(segment_ids: torch.Tensor) -> None:
    if segment_ids.dim() != 2 or segment_ids.dtype.is_floating_point:
        raise EtlError(
            f"segment_ids must be a (B, T) integer tensor (collate_packed's `segment_ids`), "
            f"got {tuple(segment_ids.shape)} {segment_ids.dtype}"
        )


def document_block_mask(
    segment_ids: torch.Tensor, *, causal: bool = True, block_size: int = 128
) -> BlockMask:
    """FlexAttention `BlockMask`: same segment (and key <= query when causal).

    Trade-off: built once per batch (the mask_mod is evaluated over B x T x T on the device;
    build it on the GPU, where the batch goes anyway), then attention skips every block that
    crosses documents; eager flex_attention (no torch.compile) works but materializes the
    scores and warns.

    Args:
        segment_ids: (B, T) integer tensor, 1..k per document, 0 on padding.
        causal: also mask the future (decoder training); False for bidirectional encoders.
        block_size: FlexAttention's block (128 matches its kernels; a T that is not a
            multiple is padded internally).

    Returns:
        A `BlockMask` for ``flex_attention(q, k, v, block_mask=...)`` with H broadcast.
    """
    _check_segments(segment_ids)
    num_rows, width = segment_ids.shape

    def mask_mod(
        b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor
    ) -> torch.Tensor:
        same = segment_ids[b, q] == segment_ids[b, kv]
        return same & (kv <= q) if causal else same

    return create_block_mask(
        mask_mod,
        B=num_rows,
        H=None,
        Q_LEN=width,
        KV_LEN=width,
        device=segment_ids.device,
        BLOCK_SIZE=block_size,
    )


def document_sdpa_mask(segment_ids: torch.Tensor, *, causal: bool = True) -> torch.Tensor:
    """Boolean (B, 1, T, T) mask for ``scaled_dot_product_attention`` (True = may attend).

    Trade-off: dense, B x T^2 bytes (128 MB at B=32, T=2048) and no skipped work; use it for
    small T, tests, or backends without FlexAttention.

    Args:
        segment_ids: (B, T) integer tensor, 1..k per document, 0 on padding.
        causal: also mask the future.

    Returns:
        ``mask[b, 0, q, k]`` True where query q may attend to key k.
    """
    _check_segments(segment_ids)
    width = segment_ids.shape[1]
    mask = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
    if causal:
        mask &= torch.ones(width, width, dtype=torch.bool, device=segment_ids.device).tril()
    return mask
