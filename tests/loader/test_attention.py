"""Packed training equals unpacked training: a tiny float64 transformer fed packed batches.

The decisive test of issue 10 point 3: with the document mask (SDPA or FlexAttention) and the
reset position ids, every example's summed loss in a packed row equals its loss run alone,
unpadded. Under seed 003's stream semantics (causal mask only, positions 0..T-1) it does not.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from etl.columns import IGNORE_INDEX, INPUT_IDS, LOSS_MASK
from etl.errors import EtlError
from etl.loader.attention import document_block_mask, document_sdpa_mask
from etl.loader.collate_packed import collate_packed
from etl.ragged import PackedBatch, from_examples
from tests.loader.tiny_model import make_model, token_losses

# Eager flex_attention on CPU is correct but unfused; the warning says so on every call.
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

VOCAB, S = 40, 24
LENGTHS = [7, 5, 9, 3, 4, 11, 6, 8, 10]
FULL = [[0, 1, 2, 3], [4, 5, 6], [7, 8]]  # row 0 holds exactly S = 24 tokens, rows 1-2 pad
NOT_FULL = [[4, 5, 6], [7, 8], [1, 2, 3]]


def examples() -> list[tuple[np.ndarray, np.ndarray]]:
    """Token ids and a loss mask per example: an untrained prompt, then a trained answer."""
    rng = np.random.default_rng(7)
    out = []
    for length in LENGTHS:
        ids = rng.integers(1, VOCAB, length)
        prompt = rng.integers(1, length)
        mask = np.arange(length) >= prompt
        mask[rng.random(length) < 0.2] = False  # a few holes, as multi-turn masks have
        out.append((ids, mask))
    return out


def pack(rows: list[list[int]]) -> tuple[PackedBatch, list[tuple[int, int, int]]]:
    """One piece per example; returns the batch and (example, row, segment) of each piece."""
    exs = examples()
    order = [e for r in rows for e in r]
    pieces = from_examples([{INPUT_IDS: exs[e][0], LOSS_MASK: exs[e][1]} for e in order])
    where = [(e, b, k + 1) for b, r in enumerate(rows) for k, e in enumerate(r)]
    batch = PackedBatch(
        pieces=pieces,
        row=np.array([b for _, b, _ in where]),
        segment=np.array([k for _, _, k in where]),
        num_rows=len(rows),
    )
    return batch, where


def alone_loss(model: torch.nn.Module, ids: np.ndarray, mask: np.ndarray) -> float:
    """Seed 000 for one example: x = ids[:-1], y = ids[1:] masked by loss_mask[1:], no padding."""
    x = torch.from_numpy(ids[:-1])[None]
    y = torch.from_numpy(np.where(mask[1:], ids[1:], IGNORE_INDEX))[None]
    logits = model(x, torch.arange(x.shape[1])[None])
    return float(token_losses(logits, y, IGNORE_INDEX).sum())


def packed_losses(
    model: torch.nn.Module, out: dict[str, np.ndarray], mode: str
) -> torch.Tensor:
    """(B, T) token losses of a y-target batch under one attention mode."""
    x, y = torch.from_numpy(out["x"]), torch.from_numpy(out["y"])
    seg, pos = torch.from_numpy(out["segment_ids"]), torch.from_numpy(out["position_ids"])
    if mode == "sdpa":
        logits = model(x, pos, attn_mask=document_sdpa_mask(seg))
    elif mode == "flex":
        logits = model(x, pos, block_mask=document_block_mask(seg, block_size=8))
    else:  # seed 003's stream semantics: causal only, positions never reset
        logits = model(x, torch.arange(x.shape[1]).expand_as(x))
    return token_losses(logits, y, IGNORE_INDEX)


def per_example(losses: torch.Tensor, seg: np.ndarray, where: list) -> dict[int, float]:
    seg_t = torch.from_numpy(seg)
    return {e: float(losses[b][seg_t[b] == k].sum()) for e, b, k in where}


@pytest.mark.parametrize("mode", ["sdpa", "flex"])
@torch.no_grad()
def test_packed_loss_equals_each_example_alone(mode: str) -> None:
    model, exs = make_model(VOCAB), examples()
    batch, where = pack(FULL)
    out = collate_packed(batch, seq_len=S, pad_id=0)
    got = per_example(packed_losses(model, out, mode), out["segment_ids"], where)
    for e, b, k in where:
        ids, mask = exs[e]
        assert got[e] == pytest.approx(alone_loss(model, ids, mask), abs=1e-5), (e, mode)
        # The per-example count a trainer divides by is the example's own trained labels.
        assert out["segment_trained"][b, k - 1] == mask[1:].sum()
    assert sum(got.values()) > 0  # the comparison is not between zeros


@torch.no_grad()
def test_stream_semantics_changes_the_losses_seed_003() -> None:
    model, exs = make_model(VOCAB), examples()
    batch, where = pack(FULL)
    out = collate_packed(batch, seq_len=S, pad_id=0)
    got = per_example(packed_losses(model, out, "stream"), out["segment_ids"], where)
    alone = {e: alone_loss(model, *exs[e]) for e, _, _ in where}
    differs = {e: abs(got[e] - alone[e]) > 1e-5 for e, _, _ in where}
    # A row's first document sees only itself either way; every later one with a trained label
    # attends across the boundary to the documents before it and reads shifted positions.
    # (Example 3 trains nothing: 0 = 0 under any semantics.)
    assert not any(differs[e] for e, _, k in where if k == 1)
    assert all(differs[e] for e, _, k in where if k > 1 and exs[e][1][1:].any())
    assert sum(differs.values()) >= 4


@torch.no_grad()
def test_labels_target_with_the_model_shift_equals_y_target() -> None:
    model, exs = make_model(VOCAB), examples()
    batch, where = pack(NOT_FULL)  # no full row: `labels` never predicts a row's token S - 1
    y_out = collate_packed(batch, seq_len=S, pad_id=0)
    lab = collate_packed(batch, seq_len=S, pad_id=0, target="labels")
    ids, labels = torch.from_numpy(lab["input_ids"]), torch.from_numpy(lab["labels"])
    seg = torch.from_numpy(lab["segment_ids"])
    logits = model(ids, torch.from_numpy(lab["position_ids"]), attn_mask=document_sdpa_mask(seg))
    shifted = token_losses(logits[:, :-1], labels[:, 1:], IGNORE_INDEX)  # the model's shift
    got = per_example(shifted, lab["segment_ids"][:, :-1], where)
    want = per_example(packed_losses(model, y_out, "sdpa"), y_out["segment_ids"], where)
    for e, _, _ in where:
        assert got[e] == pytest.approx(want[e], abs=1e-5)
        assert got[e] == pytest.approx(alone_loss(model, *exs[e]), abs=1e-5)
    np.testing.assert_array_equal(lab["segment_trained"], y_out["segment_trained"])


def test_sdpa_mask_golden() -> None:
    seg = torch.tensor([[1, 1, 2, 0]])
    want_causal = [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    assert document_sdpa_mask(seg)[0, 0].int().tolist() == want_causal
    want_full = [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    assert document_sdpa_mask(seg, causal=False)[0, 0].int().tolist() == want_full
    with pytest.raises(EtlError, match="segment_ids"):
        document_sdpa_mask(seg[0])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block_size", [8, 128])
def test_block_mask_attends_like_the_sdpa_mask(causal: bool, block_size: int) -> None:
    from torch.nn.attention.flex_attention import flex_attention

    seg = torch.tensor([[1] * 9 + [2] * 7 + [0] * 7, [1] * 4 + [2] * 12 + [3] * 7])  # T = 23
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 2, 2, 23, 8, generator=gen, dtype=torch.float64)
    dense = document_sdpa_mask(seg, causal=causal)
    assert dense.any(-1).all()  # padding attends to padding: no fully masked query
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    block = document_block_mask(seg, causal=causal, block_size=block_size)
    got = flex_attention(q, k, v, block_mask=block)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
