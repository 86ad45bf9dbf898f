"""Pair masks: a hand-worked SDPA mask, the BlockMask against it (FlexAttention runs eagerly on
CPU: its forward), the sliding window in positions, and pair_hf_inputs' refusals."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

from etl.errors import EtlError
from etl.loader import (
    collate_pairs,
    collate_pairs_packed,
    pack_pairs,
    pair_block_mask,
    pair_sdpa_mask,
    rows_from_examples,
)
from etl.loader.pairs.pack import PackedPairs
from etl.train import pair_hf_inputs


def one_row() -> dict[str, torch.Tensor]:
    """[p p c c r | p c r r | pad]: two pairs and one padding token."""
    rows = rows_from_examples([{"prompt_ids": [1, 2], "chosen_ids": [3, 4], "rejected_ids": [5]},
                               {"prompt_ids": [6], "chosen_ids": [7], "rejected_ids": [8, 9]}])
    out = collate_pairs_packed(PackedPairs(rows, np.array([0, 0]), 1), seq_len=10, pad_id=0)
    return {k: torch.from_numpy(v) for k, v in out.items()}


def test_sdpa_mask_by_hand() -> None:
    b = one_row()
    got = pair_sdpa_mask(b["pair_ids"], b["part_ids"])
    assert got.shape == (1, 1, 10, 10) and got.dtype == torch.bool
    want = [
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # p
        [1, 1, 0, 0, 0, 0, 0, 0, 0, 0],  # p
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 0],  # c: prompt + itself
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],  # c
        [1, 1, 0, 0, 1, 0, 0, 0, 0, 0],  # r: prompt + itself, never chosen
        [0, 0, 0, 0, 0, 1, 0, 0, 0, 0],  # p of pair 2: nothing of pair 1
        [0, 0, 0, 0, 0, 1, 1, 0, 0, 0],  # c
        [0, 0, 0, 0, 0, 1, 0, 1, 0, 0],  # r
        [0, 0, 0, 0, 0, 1, 0, 1, 1, 0],  # r
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 1],  # padding: itself
    ]
    assert got[0, 0].int().tolist() == want
    # A window of 2 positions: the second rejected token (position 2) loses position 0.
    windowed = pair_sdpa_mask(b["pair_ids"], b["part_ids"], position_ids=b["position_ids"], window=2)
    assert windowed[0, 0, 8].int().tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 1, 0]
    assert windowed[0, 0, 4].int().tolist() == [0, 1, 0, 0, 1, 0, 0, 0, 0, 0]  # position 2: keeps 1
    with pytest.raises(EtlError, match="position_ids"):
        pair_sdpa_mask(b["pair_ids"], b["part_ids"], window=2)


@pytest.mark.filterwarnings("ignore::UserWarning")  # eager flex_attention warns it is not compiled
def test_block_mask_attends_as_the_sdpa_mask() -> None:
    rng = np.random.default_rng(0)
    pairs = [{"prompt_ids": rng.integers(0, 9, int(rng.integers(1, 9))),
              "chosen_ids": rng.integers(0, 9, int(rng.integers(1, 9))),
              "rejected_ids": rng.integers(0, 9, int(rng.integers(1, 9)))} for _ in range(12)]
    packed, _, _ = pack_pairs(rows_from_examples(pairs), seq_len=40)
    b = {k: torch.from_numpy(v) for k, v in collate_pairs_packed(packed, seq_len=40, pad_id=0).items()}
    q, k, v = torch.randn(3, b["pair_ids"].shape[0], 2, 40, 8, dtype=torch.float64,
                          generator=torch.Generator().manual_seed(0))
    for window in (None, 3):
        kw = {"position_ids": b["position_ids"], "window": window}
        block = pair_block_mask(b["pair_ids"], b["part_ids"], block_size=8, **kw)
        dense = pair_sdpa_mask(b["pair_ids"], b["part_ids"], **kw)
        got = flex_attention(q, k, v, block_mask=block)
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    # blocks between pairs are skipped: the first 8-token block row does not reach the last
    assert block.to_dense()[0, 0, 0, -1] == 0


def fake_model(impl: str, **config: object) -> SimpleNamespace:
    return SimpleNamespace(config=SimpleNamespace(_attn_implementation=impl, **config),
                           parameters=lambda: iter(()), training=False)


def test_hf_inputs_per_implementation() -> None:
    b = one_row()
    kw = pair_hf_inputs(b, fake_model("sdpa"))
    assert sorted(kw) == ["attention_mask", "input_ids", "position_ids", "use_cache"] and kw["use_cache"] is False
    assert torch.equal(kw["attention_mask"], pair_sdpa_mask(b["pair_ids"], b["part_ids"]))
    eager = pair_hf_inputs(b, fake_model("eager"))["attention_mask"]
    assert eager.dtype == torch.float32 and torch.equal(eager == 0, kw["attention_mask"])
    flex = pair_hf_inputs(b, fake_model("flex_attention"))["attention_mask"]
    assert type(flex).__name__ == "BlockMask"
    windowed = pair_hf_inputs(b, fake_model("sdpa", layer_types=["full_attention", "sliding_attention"],
                                             sliding_window=2))["attention_mask"]
    assert sorted(windowed) == ["full_attention", "sliding_attention"]
    with pytest.raises(EtlError, match="custom attention mask"):
        pair_hf_inputs(b, fake_model("flash_attention_2"))
    with pytest.raises(EtlError, match="chunked"):
        pair_hf_inputs(b, fake_model("sdpa", attention_chunk_size=4))
    padded = collate_pairs([{"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3, 4]}], pad_id=0)
    kw = pair_hf_inputs(padded, fake_model("flash_attention_2"))  # TRL's call: any implementation
    assert sorted(kw) == ["attention_mask", "input_ids", "use_cache"]
    with pytest.raises(EtlError, match="needs a preference batch"):
        pair_hf_inputs({"input_ids": b["input_ids"]}, fake_model("sdpa"))
