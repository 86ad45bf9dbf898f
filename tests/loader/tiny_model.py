"""A tiny causal transformer in plain torch (tests only): the judge of packed == unpacked training.

Learned absolute positions indexed by ``position_ids`` (so the reset positions of a packed row
reach the model), pre-norm blocks, attention by SDPA with an explicit boolean mask, SDPA causal,
or FlexAttention with a `BlockMask`. Run it in float64 on CPU so equal maths gives equal losses
to ~1e-12, far inside the 1e-5 the tests ask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def attend(
        self, h: torch.Tensor, attn_mask: torch.Tensor | None, block_mask: BlockMask | None
    ) -> torch.Tensor:
        batch, width, dim = h.shape
        q, k, v = self.qkv(h).view(batch, width, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        if block_mask is not None:
            out = flex_attention(q, k, v, block_mask=block_mask)
        elif attn_mask is not None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, width, dim))

    def forward(
        self, h: torch.Tensor, attn_mask: torch.Tensor | None, block_mask: BlockMask | None
    ) -> torch.Tensor:
        h = h + self.attend(self.norm1(h), attn_mask, block_mask)
        return h + self.mlp(self.norm2(h))


class TinyCausalLM(nn.Module):
    """2 layers, d=32, 2 heads by default; ``forward`` returns (B, T, vocab) logits."""

    def __init__(
        self, vocab: int, *, dim: int = 32, heads: int = 2, layers: int = 2, max_pos: int = 64
    ) -> None:
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, dim), nn.Embedding(max_pos, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(
        self,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        *,
        attn_mask: torch.Tensor | None = None,
        block_mask: BlockMask | None = None,
    ) -> torch.Tensor:
        h = self.embed(ids) + self.pos(position_ids)
        for block in self.blocks:
            h = block(h, attn_mask, block_mask)
        return self.head(self.norm(h))


def make_model(vocab: int, *, seed: int = 0) -> TinyCausalLM:
    """A float64 model with fixed random weights (seeded, independent of the global RNG)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = TinyCausalLM(vocab).double().eval()
    return model


def token_losses(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """(B, T) cross-entropy per label, 0 where ignored (no reduction: tests sum per example)."""
    flat = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        labels.reshape(-1),
        ignore_index=ignore_index,
        reduction="none",
    )
    return flat.view(labels.shape)
