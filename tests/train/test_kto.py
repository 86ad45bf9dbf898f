"""KTO on unpaired rows: `kto_loss` against TRL 1.16's own KTOTrainer loss code, `unpaired_logps`
against each example scored alone, and the mismatched rows of a padded batch against TRL's cycle."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from etl.cli import main
from etl.errors import EtlError
from etl.loader import ParquetLoader, collate_unpaired
from etl.train import dpo_loss, hf_inputs, kto_loss, unpaired_logps

transformers = pytest.importorskip("transformers")

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "preference"


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/train/conftest.py


def _trl_kto_loss(logps, ref, labels, kl_logps, ref_kl, *, beta: float, dw: float, uw: float) -> torch.Tensor:
    """TRL 1.16's ``KTOTrainer._compute_loss`` itself on these sums: the trainer is built without its
    __init__ (no model, no data), the model is a stand-in whose per-token log-probs sum to the given
    sums, and the reference sums come precomputed, as ``precompute_ref_logps`` gives them."""
    trl = pytest.importorskip("trl")
    trainer = trl.KTOTrainer.__new__(trl.KTOTrainer)
    metrics: defaultdict = defaultdict(lambda: defaultdict(list))
    trainer.__dict__.update(
        model=SimpleNamespace(training=True), accelerator=SimpleNamespace(device="cpu", gather_for_metrics=lambda t: t),
        loss_type="kto", beta=beta, desirable_weight=dw, undesirable_weight=uw, calculate_KL=True,
        precompute_ref_logps=True, aux_loss_enabled=False, _metrics=metrics, _total_train_tokens=0, _tp_size=1)
    n = len(labels)
    kl_ids = torch.ones(n, 3, dtype=torch.long)  # the KL call's input_ids, told apart by value

    def model(**kw):
        sums = kl_logps if torch.equal(kw["input_ids"], kl_ids) else logps
        per_token = torch.stack([sums, torch.zeros(n, dtype=sums.dtype)], 1)  # 2 scored tokens, summed
        return SimpleNamespace(log_probs=per_token, entropy=torch.zeros(n, 2), mean_logits=torch.zeros(n, 2))

    ones = torch.ones(n, 3, dtype=torch.long)
    batch = {"label": labels, "input_ids": torch.zeros(n, 3, dtype=torch.long), "attention_mask": ones,
             "completion_mask": ones, "KL_input_ids": kl_ids, "KL_attention_mask": ones, "KL_completion_mask": ones,
             "ref_logps": ref, "ref_KL_logps": ref_kl}
    return trainer._compute_loss(model, batch, return_outputs=False)


@pytest.mark.parametrize(("beta", "dw", "uw", "shift"), [(0.1, 1.0, 1.0, 0.0), (0.5, 1.3, 0.7, 0.0),
                                                          (0.1, 1.0, 1.0, -50.0)])  # shift: KL < 0, clamped
def test_kto_loss_equals_trls_own_loss_code(beta: float, dw: float, uw: float, shift: float) -> None:
    g = torch.Generator().manual_seed(0)
    logps, ref, kl_logps, ref_kl = (-20 * torch.rand(8, generator=g, dtype=torch.float64) for _ in range(4))
    kl_logps = kl_logps + shift
    labels = torch.tensor([True, False, True, True, False, False, True, False])
    logps.requires_grad_(True)
    ours = kto_loss(logps, ref, labels, kl_logps=kl_logps, ref_kl_logps=ref_kl, beta=beta,
                    desirable_weight=dw, undesirable_weight=uw)
    theirs = _trl_kto_loss(logps, ref, labels, kl_logps, ref_kl, beta=beta, dw=dw, uw=uw)
    torch.testing.assert_close(ours, theirs.to(ours.dtype), rtol=1e-12, atol=0)
    (grad_ours,) = torch.autograd.grad(ours, logps, retain_graph=True)
    (grad_theirs,) = torch.autograd.grad(theirs, logps)
    torch.testing.assert_close(grad_ours, grad_theirs, rtol=1e-12, atol=0)


def test_kto_loss_hand_worked_and_kl_given() -> None:
    # r = logps - ref = [2, -1]; z0 = mean([3, 1] - [1, 1]) = 1; beta 1:
    # desirable: 1 - sigmoid(2 - 1); undesirable (weight 2): 2 * (1 - sigmoid(1 - (-1))).
    logps, ref, labels = torch.tensor([-1.0, -4.0]), torch.tensor([-3.0, -3.0]), torch.tensor([True, False])
    want = ((1 - 1 / (1 + math.exp(-1))) + 2 * (1 - 1 / (1 + math.exp(-2)))) / 2
    got = kto_loss(logps, ref, labels, kl_logps=torch.tensor([3.0, 1.0]), ref_kl_logps=torch.tensor([1.0, 1.0]),
                   beta=1.0, undesirable_weight=2.0)
    assert float(got) == pytest.approx(want, rel=1e-6)
    assert float(kto_loss(logps, ref, labels, kl=1.0, beta=1.0, undesirable_weight=2.0)) == pytest.approx(want)
    assert float(kto_loss(logps, ref, labels, kl=-3.0, beta=1.0)) == pytest.approx(  # clamped at 0
        float(kto_loss(logps, ref, labels, kl=0.0, beta=1.0)))


@pytest.mark.parametrize("beta", [-1.0, 0.0, float("nan"), float("inf"), "0.1", True])
def test_beta_that_is_not_a_positive_number_raises(beta) -> None:
    x = torch.zeros(2)
    with pytest.raises(ValueError, match=r"dpo_loss\(beta=...\) must be a finite number > 0"):
        dpo_loss(x, x, x, x, beta=beta)
    with pytest.raises(ValueError, match=r"kto_loss\(beta=...\) must be a finite number > 0"):
        kto_loss(x, x, torch.tensor([True, False]), kl=0.0, beta=beta)


def test_kto_loss_errors_say_how_to_fix() -> None:
    x, labels = torch.zeros(2), torch.tensor([True, False])
    with pytest.raises(ValueError, match=r"undesirable_weight=...\) must be a finite number >= 0"):
        kto_loss(x, x, labels, kl=0.0, undesirable_weight=-1.0)
    with pytest.raises(EtlError, match="one way"):
        kto_loss(x, x, labels)  # neither
    with pytest.raises(EtlError, match="one way"):
        kto_loss(x, x, labels, kl=0.0, kl_logps=x, ref_kl_logps=x)  # both
    with pytest.raises(EtlError, match=r"must be the same \(N,\)"):
        kto_loss(x, x[:1], labels, kl=0.0)


def test_padded_batch_carries_trls_mismatched_rows() -> None:
    rows = [{"prompt_ids": [5, 6], "completion_ids": [7, 8], "completion_mask": [True, False], "label": True},
            {"prompt_ids": [9], "completion_ids": [10], "label": False},
            {"prompt_ids": [11, 12, 13], "completion_ids": [14, 15, 16], "label": True}]
    out = collate_unpaired(rows, seq_len=7, pad_id=0)
    # TRL: KL_completion_ids = [completion_ids[-1]] + completion_ids[:-1], each after its own prompt.
    trl_kl = [r["prompt_ids"] + rows[i - 1]["completion_ids"] for i, r in enumerate(rows)]
    assert out["kl_x"].tolist() == [(s + [0] * 7)[:6] for s in trl_kl]  # T = S - 1 = 6, pad 0
    assert out["kl_y"].tolist() == [[-100, 14, 15, 16, -100, -100],
                                    [7, -100, -100, -100, -100, -100],  # row 0's completion, its mask
                                    [-100, -100, 10, -100, -100, -100]]
    assert out["kl_attention_mask"].sum(1).tolist() == [len(s) for s in trl_kl]
    assert out["x"].tolist()[1] == [9, 10, 0, 0, 0, 0] and out["label"].tolist() == [True, False, True]


def _model(vocab: int) -> torch.nn.Module:
    config = transformers.Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.Qwen2ForCausalLM._from_config(config, attn_implementation="sdpa")
    return model.double().eval()


def _alone(model: torch.nn.Module, prompt: np.ndarray, completion: np.ndarray, mask: np.ndarray) -> float:
    """One example run alone, unpadded: its trained completion tokens' summed log-probs."""
    ids = torch.as_tensor(np.concatenate([prompt, completion]), dtype=torch.long)[None]
    logp = F.log_softmax(model(input_ids=ids).logits[0, :-1], -1).gather(1, ids[0, 1:, None])[:, 0]
    trained = torch.as_tensor(np.concatenate([np.zeros(len(prompt), bool), mask]))[1:]
    return float(logp[trained].sum())


@torch.no_grad()
def test_unpaired_logps_padded_and_packed_equal_each_example_alone(tmp_path: Path) -> None:
    dst = tmp_path / "kto"
    assert main(["run", str(ASSETS / "unpaired.jsonl"), str(dst), "--input-type", "unpaired",
                 "--template", "ngpt", "--seq-len", "256", "--quiet"]) == 0
    padded = ParquetLoader(dst, batch_size=8, shuffle=False, drop_last=False, collate="longest")
    model = _model(padded.dataset.manifest["tokenizer"]["vocab_size"])
    rows = [padded.dataset[i] for i in range(len(padded.dataset))]
    want = {i: _alone(model, r["prompt_ids"], r["completion_ids"], r["completion_mask"]) for i, r in enumerate(rows)}
    (batch,) = list(padded)
    logps, labels = unpaired_logps(model(input_ids=batch["x"], attention_mask=batch["attention_mask"]).logits, batch)
    assert logps.tolist() == pytest.approx([want[i] for i in range(len(rows))], abs=1e-9)
    assert labels.tolist() == [bool(r["label"]) for r in rows]
    kl_logits = model(input_ids=batch["kl_x"], attention_mask=batch["kl_attention_mask"]).logits
    kl_logps, _ = unpaired_logps(kl_logits, batch, kl=True)
    n = len(rows)
    assert kl_logps.tolist() == pytest.approx([_alone(model, rows[i]["prompt_ids"], rows[i - 1]["completion_ids"],
                                                      rows[i - 1]["completion_mask"]) for i in range(n)], abs=1e-9)
    packed = ParquetLoader(dst, batch_size=1, packing="bfd", seed=0)
    got = {}
    for b in packed:
        sums, labs = unpaired_logps(model(**hf_inputs(b, model)).logits, b)
        for s, lab in zip(sums.tolist(), labs.tolist(), strict=True):
            (i,) = [i for i in want if abs(want[i] - s) < 1e-9 and i not in got]  # each example once
            got[i] = lab
        with pytest.raises(EtlError, match="packed ones do not"):
            unpaired_logps(model(**hf_inputs(b, model)).logits, b, kl=True)
    assert got == {i: bool(r["label"]) for i, r in enumerate(rows)}
