"""The decisive check: a tiny transformers Qwen2 gives every pair the same chosen and rejected
log-prob sums, and the same gradients, from the prefix-shared packed batch as from TRL's padded rows.

The model is random, built here, float64 in ``train()`` mode with dropout 0 (Qwen2's RMSNorm
computes in float32: sums agree to ~1e-14, gradients to ~1e-7; 1e-5 is asked). The padded path
is itself checked against each sequence run alone, scored with a plain log_softmax.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from etl.cli import main
from etl.loader import (
    ParquetLoader,
    collate_pairs,
    collate_pairs_packed,
    pack_pairs,
    rows_from_examples,
)
from etl.train import completion_logps, dpo_loss, pair_hf_inputs

transformers = pytest.importorskip("transformers")

VOCAB, S = 64, 48
ASSETS = Path(__file__).resolve().parents[1] / "assets" / "preference"


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/train/conftest.py


def tiny_qwen2(impl: str, *, vocab: int = VOCAB, windowed: bool = False) -> torch.nn.Module:
    """2 layers, hidden 32, 4 heads over 2 kv heads, float64, seeded; ``windowed``: the second
    layer slides a window of 6 positions (shorter than most pairs)."""
    window = {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1} if windowed else {}
    config = transformers.Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.0, **window)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.Qwen2ForCausalLM._from_config(config, attn_implementation=impl)
    return model.double().train()


def random_pairs(n: int = 16, seed: int = 0) -> list[dict]:
    """Pairs of 1-11 token parts; ~20% of completion tokens untrained (a tool result's share)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        p, c, r = (int(x) for x in rng.integers(1, 12, 3))
        out.append({"prompt_ids": rng.integers(2, VOCAB, p), "chosen_ids": rng.integers(2, VOCAB, c),
                    "rejected_ids": rng.integers(2, VOCAB, r), "chosen_mask": rng.random(c) < 0.8,
                    "rejected_mask": rng.random(r) < 0.8})
    return out


def logps(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    return completion_logps(model(**pair_hf_inputs(batch, model)).logits, batch)


def grads(loss: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([g.flatten() for g in torch.autograd.grad(loss, list(model.parameters()))])


def check_packed_equals_padded(model: torch.nn.Module, pairs: list[dict], *, atol: float = 1e-5) -> None:
    padded = collate_pairs(pairs, pad_id=0)
    packed, order, skipped = pack_pairs(rows_from_examples(pairs), seq_len=S)
    batch = collate_pairs_packed(packed, seq_len=S, pad_id=0)
    assert len(skipped) == 0 and batch["input_ids"].shape[0] < len(pairs) / 2  # several pairs a row
    chosen_pad, rejected_pad = logps(model, padded)
    chosen_pack, rejected_pack = logps(model, batch)
    torch.testing.assert_close(chosen_pack, chosen_pad[order], rtol=0, atol=atol)
    torch.testing.assert_close(rejected_pack, rejected_pad[order], rtol=0, atol=atol)
    # Weights per pair, so an error in one pair cannot cancel another's.
    w = torch.linspace(0.5, 1.5, len(pairs), dtype=torch.float64)
    v = torch.linspace(-1.0, 1.0, len(pairs), dtype=torch.float64)
    want = grads((w * chosen_pad).sum() + (v * rejected_pad).sum(), model)
    got = grads((w[order] * chosen_pack).sum() + (v[order] * rejected_pack).sum(), model)
    assert float(want.abs().max()) > 0.1  # not a comparison between zeros
    torch.testing.assert_close(got, want, rtol=0, atol=atol)


@pytest.mark.parametrize(("impl", "windowed"), [("sdpa", False), ("eager", False), ("sdpa", True)],
                         ids=["sdpa", "eager", "sdpa-sliding-window"])
def test_packed_prefix_sharing_equals_trl_padded_rows(impl: str, windowed: bool) -> None:
    # eager + sliding window is left out: transformers' own padded reference gives NaN gradients
    # there (right padding leaves the padding queries of a window with no key at all).
    check_packed_equals_padded(tiny_qwen2(impl, windowed=windowed), random_pairs())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's backward needs CUDA")
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_flex_attention_packed_equals_padded() -> None:
    model = tiny_qwen2("flex_attention").float().cuda()  # the dtypes its kernels take
    check_packed_equals_padded(model, random_pairs(), atol=2e-4)  # float32 sums of ~50 tokens


@torch.no_grad()
def test_padded_logps_equal_each_sequence_alone() -> None:
    model, pairs = tiny_qwen2("sdpa"), random_pairs(6, seed=1)
    chosen, rejected = logps(model, collate_pairs(pairs, pad_id=0))
    for i, pair in enumerate(pairs):
        for side, got in (("chosen", chosen[i]), ("rejected", rejected[i])):
            ids = torch.tensor(np.concatenate([pair["prompt_ids"], pair[f"{side}_ids"]]))[None]
            trained = torch.tensor(np.concatenate([np.zeros(len(pair["prompt_ids"]), bool), pair[f"{side}_mask"]]))
            lp = F.log_softmax(model(input_ids=ids, use_cache=False).logits[0, :-1], -1)
            want = lp.gather(1, ids[0, 1:, None])[:, 0][trained[1:]].sum()
            assert abs(float(got - want)) < 1e-10, (i, side)


def test_dpo_loss_by_hand() -> None:
    chosen, rejected = torch.tensor([-3.0, -5.0]), torch.tensor([-4.0, -4.0])
    ref_c, ref_r = torch.tensor([-3.5, -5.0]), torch.tensor([-3.5, -2.0])
    # margins: (-3 + 3.5) - (-4 + 3.5) = 1 and (-5 + 5) - (-4 + 2) = 2; loss -log(sigmoid(beta x m))
    want = (math.log(1 + math.exp(-0.5 * 1.0)) + math.log(1 + math.exp(-0.5 * 2.0))) / 2
    assert float(dpo_loss(chosen, rejected, ref_c, ref_r, beta=0.5)) == pytest.approx(want, rel=1e-6)


def test_a_real_run_packed_and_padded_through_the_loader(tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    assert main(["run", str(ASSETS / "pairs.jsonl"), str(dst), "--input-type", "preference", "--template", "ngpt",
                 "--seq-len", "256", "--quiet"]) == 0
    padded = ParquetLoader(dst, batch_size=64, shuffle=False, drop_last=False)
    packed = ParquetLoader(dst, batch_size=64, packing="bfd", seed=3, drop_last=False)
    assert packed.skipped_pairs == 0
    model = tiny_qwen2("sdpa", vocab=packed.dataset.manifest["tokenizer"]["vocab_size"])
    (pad_batch,), (pack_batch,) = list(padded), list(packed)
    with torch.no_grad():
        chosen_pad, rejected_pad = logps(model, pad_batch)
        chosen_pack, rejected_pack = logps(model, pack_batch)
    # The packed order is bfd's: find each packed pair's row by its tokens.
    by_tokens = {}
    for i in range(len(padded.dataset)):
        e = padded.dataset[i]
        by_tokens[tuple(np.concatenate([e["prompt_ids"], e["chosen_ids"], e["rejected_ids"]]).tolist())] = i
    n = 0
    for b, row in enumerate(pack_batch["pair_ids"]):
        for k in range(1, int(row.max()) + 1):
            i = by_tokens[tuple(pack_batch["input_ids"][b, row == k].tolist())]
            assert abs(float(chosen_pack[n] - chosen_pad[i])) < 1e-5
            assert abs(float(rejected_pack[n] - rejected_pad[i])) < 1e-5
            n += 1
    assert n == len(padded.dataset) >= 4
