"""Loss normalisation: hand-worked values (2 ranks x 2 micro-batches, a packed batch with padding
and an example with no trained token), transformers' own loss, a per-example Python reference on
hypothesis batches, the real loader's epoch against its raw examples, and a real 2-rank DDP run."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.columns import IGNORE_INDEX
from etl.errors import EtlError
from etl.loader import PackOptions, ParquetLoader
from etl.loader.collate_packed import collate_packed
from etl.train import (
    count_examples,
    count_trained,
    example_losses,
    example_mean_loss,
    sequence_sum_loss,
    token_losses,
    token_mean_loss,
)
from tests.loader.conftest import random_examples
from tests.loader.test_collate_packed import golden

N = IGNORE_INDEX
GARBAGE = 100.0  # the loss at untrained positions: must never reach a sum


def padded(values: list[list[float]], mask: list[list[int]]) -> tuple[torch.Tensor, dict]:
    """Per-token losses (untrained -> GARBAGE) and a padded batch whose y is -100 off the mask."""
    trained = torch.tensor(mask, dtype=torch.bool)
    losses = torch.where(trained, torch.tensor(values, dtype=torch.float64), GARBAGE)
    y = torch.where(trained, 7, N)
    return losses, {"x": torch.zeros_like(y), "y": y, "loss_mask": trained}


# Two ranks x two micro-batches of 2 rows, T = 3 (rank 1's second micro-batch trains nothing):
#   rank 0: [1 2 .] [3 . .] | [4 . .] [. . .]     rank 1: [5 6 7] [8 9 10] | [. . .] [. . .]
# All trained tokens: 1..10, sum 55, N = 10, mean 5.5. Examples (rows with a trained token):
# means 1.5, 3, 4, 6, 9 -> 23.5 / 5 = 4.7; sums 3, 3, 4, 18, 27 -> 55 / 5 = 11.
TOY = [
    [padded([[1, 2, 0], [3, 0, 0]], [[1, 1, 0], [1, 0, 0]]),
     padded([[4, 0, 0], [0, 0, 0]], [[1, 0, 0], [0, 0, 0]])],
    [padded([[5, 6, 7], [8, 9, 10]], [[1, 1, 1], [1, 1, 1]]),
     padded([[0, 0, 0], [0, 0, 0]], [[0, 0, 0], [0, 0, 0]])],
]
RULES = [  # (rule, step count, hand-computed mean over the step)
    (token_mean_loss, count_trained, 5.5),
    (example_mean_loss, count_examples, 4.7),
    (sequence_sum_loss, count_examples, 11.0),
]


@pytest.mark.parametrize(("rule", "counter", "expected"), RULES)
def test_two_ranks_two_micro_batches_give_the_global_mean(rule, counter, expected) -> None:
    every = [batch for rank in TOY for _, batch in rank]
    count = counter(every)  # what the all_reduce of each rank's count gives
    assert int(count) == (10 if counter is count_trained else 5)
    grads, values = [], []
    for rank in TOY:  # each rank: its own copy of the parameter, grads summed over micro-batches
        theta = torch.ones((), dtype=torch.float64, requires_grad=True)
        total = sum(rule(theta * losses, batch, count, world_size=2) for losses, batch in rank)
        total.backward()
        grads.append(float(theta.grad))
        values.append(float(total.detach()))
    # DDP averages the ranks' gradients: the average is the gradient of the global mean.
    assert sum(grads) / 2 == pytest.approx(expected, rel=1e-12)
    assert sum(values) / 2 == pytest.approx(expected, rel=1e-12)  # logging: the ranks' average
    # Summed gradients (world_size=1) give the same step.
    summed = sum(float(rule(losses, batch, count, world_size=1)) for rank in TOY for losses, batch in rank)
    assert summed == pytest.approx(expected, rel=1e-12)


def test_per_micro_batch_means_are_not_the_step_mean() -> None:
    # Rank 0's means (2, 4) and rank 1's (7.5, nothing: 0) average to 3.375, not 5.5.
    means = [float(token_mean_loss(losses, batch)) for rank in TOY for losses, batch in rank]
    assert means == [2.0, 4.0, 7.5, 0.0]  # no NaN for a micro-batch with no trained token
    assert sum(means) / 4 == 3.375


# A packed batch, T = 6. Row 0: document 1 (losses 1, 3 trained), document 2 (nothing trained),
# then padding (segment 0). Row 1: document 1 (2, 4), document 2 (1, 2, 3).
PACKED_SEG = [[1, 1, 2, 2, 0, 0], [1, 1, 1, 2, 2, 2]]
PACKED_MASK = [[1, 1, 0, 0, 0, 0], [0, 1, 1, 1, 1, 1]]
PACKED_LOSS = [[1, 3, 50, 50, 70, 70], [9, 2, 4, 1, 2, 3]]


def packed_batch(with_counts: bool = True) -> tuple[torch.Tensor, dict]:
    losses, batch = padded(PACKED_LOSS, PACKED_MASK)
    batch["segment_ids"] = torch.tensor(PACKED_SEG, dtype=torch.int32)
    if with_counts:
        batch["segment_trained"] = torch.tensor([[2, 0], [2, 3]], dtype=torch.int32)
    return losses, batch


@pytest.mark.parametrize("with_counts", [True, False])
def test_packed_batch_with_padding_and_an_untrained_example(with_counts: bool) -> None:
    losses, batch = packed_batch(with_counts)
    sums, counts = example_losses(losses, batch)
    assert sums.tolist() == [[4, 0], [6, 6]] and counts.tolist() == [[2, 0], [2, 3]]
    assert float(example_mean_loss(losses, batch)) == pytest.approx((2 + 3 + 2) / 3)  # not 0 / 0
    assert float(token_mean_loss(losses, batch)) == pytest.approx(16 / 7)
    assert float(sequence_sum_loss(losses, batch)) == pytest.approx((4 + 6 + 6) / 3)
    assert int(count_examples(batch)) == 3 and int(count_trained(batch)) == 7
    example_mean_loss(losses.requires_grad_(True), batch).backward()
    grad = losses.grad.tolist()  # 1 / (count x examples) on trained positions, 0 elsewhere
    assert grad[0] == pytest.approx([1 / 6, 1 / 6, 0, 0, 0, 0])
    assert grad[1] == pytest.approx([0, 1 / 6, 1 / 6, 1 / 9, 1 / 9, 1 / 9])


def test_the_old_readme_weight_formula_fails_on_padding() -> None:
    _, batch = packed_batch()
    with pytest.raises(RuntimeError):  # segment 0 (padding) - 1 = -1: out of range for gather
        batch["segment_trained"].gather(1, batch["segment_ids"].long() - 1)


@pytest.mark.parametrize("target", ["y", "labels"])
def test_agrees_with_transformers_loss_and_count(target: str) -> None:
    loss_utils = pytest.importorskip("transformers.loss.loss_utils")
    batch = {k: torch.from_numpy(v) for k, v in collate_packed(golden(), seq_len=8, pad_id=0, target=target).items()}
    labels = batch[target]
    logits = torch.randn(*labels.shape, 40, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    n = count_trained(batch)
    # The Trainer's count: labels[..., 1:] for models that shift, else every label.
    assert int(n) == int((labels[..., 1:] if target == "labels" else labels).ne(N).sum()) == 7
    if target == "labels":
        theirs = loss_utils.ForCausalLMLoss(logits, labels, 40, num_items_in_batch=n)
    else:
        theirs = loss_utils.ForCausalLMLoss(logits, None, 40, num_items_in_batch=n, shift_labels=labels)
    ours = token_mean_loss(token_losses(logits, batch), batch, n, world_size=1)
    assert float(ours) == pytest.approx(float(theirs), rel=1e-6)


def test_y_and_labels_targets_give_the_same_losses() -> None:
    # The golden rows are not full, so both targets train the same labels at the same positions.
    out = {t: {k: torch.from_numpy(v) for k, v in collate_packed(golden(), seq_len=8, pad_id=0, target=t).items()}
           for t in ("y", "labels")}
    # x is the first T_y columns of input_ids (a labels batch may hold one column more: T = S).
    width = out["labels"]["input_ids"].shape[1]
    logits = torch.randn(2, width, 40, generator=torch.Generator().manual_seed(1))
    per = {t: token_losses(logits[:, : b[t].shape[1]], b) for t, b in out.items()}
    # torch.allclose, not torch.testing.assert_close: its first call imports for ~3 s.
    assert torch.allclose(per["y"], per["labels"][:, :7], rtol=1e-6, atol=1e-7)
    assert not per["labels"][:, 7:].any()  # a last position predicts nothing
    for rule in (token_mean_loss, example_mean_loss, sequence_sum_loss):
        assert float(rule(per["y"], out["y"])) == pytest.approx(float(rule(per["labels"], out["labels"])))


def test_errors_say_how_to_fix() -> None:
    losses, batch = packed_batch()
    with pytest.raises(EtlError, match="pass the count too"):
        token_mean_loss(losses, batch, world_size=2)
    with pytest.raises(EtlError, match="reduction='none'"):
        example_mean_loss(losses[:, :-1], batch)
    with pytest.raises(EtlError, match="no 'y' nor 'labels'"):
        count_trained({"x": batch["x"]})
    with pytest.raises(EtlError, match="micro-batches of one optimizer step"):
        count_trained([])
    with pytest.raises(EtlError, match="logits"):
        token_losses(torch.zeros(2, 5, 9), batch)


@st.composite
def batches(draw) -> tuple[list[list[float]], list[list[int]], list[list[int]] | None]:
    """(losses, mask, segments or None for a padded batch): B <= 3 rows of T <= 8 positions."""
    num_rows, width = draw(st.integers(1, 3)), draw(st.integers(1, 8))
    packed = draw(st.booleans())
    losses, mask, segs = [], [], []
    for _ in range(num_rows):
        used = draw(st.integers(0, width))
        cuts = sorted(draw(st.sets(st.integers(1, max(used - 1, 1)), max_size=3))) if used > 1 else []
        seg = [1 + sum(i >= c for c in cuts) for i in range(used)] + [0] * (width - used)
        if not packed:
            seg = [1] * used + [0] * (width - used)
        mask.append([int(s > 0 and draw(st.booleans())) for s in seg])
        losses.append(draw(st.lists(st.floats(0, 10), min_size=width, max_size=width)))
        segs.append(seg)
    return losses, mask, segs if packed else None


def reference(losses, mask, segs) -> tuple[float, float, float]:
    """Token mean, example mean, sequence-sum mean, by a loop over positions."""
    docs: dict[tuple[int, int], list[float]] = {}
    for b, row in enumerate(losses):
        for t, value in enumerate(row):
            if mask[b][t]:
                docs.setdefault((b, segs[b][t] if segs else 1), []).append(value)
    tokens = [v for vals in docs.values() for v in vals]
    if not docs:
        return 0.0, 0.0, 0.0
    means = [sum(v) / len(v) for v in docs.values()]
    return sum(tokens) / len(tokens), sum(means) / len(means), sum(map(sum, docs.values())) / len(docs)


@settings(max_examples=150, deadline=None)
@given(batches(), st.booleans())
def test_matches_a_per_example_reference(case, with_counts: bool) -> None:
    values, mask, segs = case
    losses, batch = padded(values, mask)
    if segs is not None:
        batch["segment_ids"] = torch.tensor(segs, dtype=torch.int32)
        if with_counts:  # what the packed collate writes, counted here by a loop
            k = max(max(row) for row in segs) or 1
            batch["segment_trained"] = torch.tensor(
                [[sum(m for m, s in zip(mrow, srow, strict=True) if s == j) for j in range(1, k + 1)]
                 for mrow, srow in zip(mask, segs, strict=True)], dtype=torch.int32)
    got = [float(rule(losses, batch)) for rule in (token_mean_loss, example_mean_loss, sequence_sum_loss)]
    for ours, ref in zip(got, reference(values, mask, segs), strict=True):
        assert math.isfinite(ours) and ours == pytest.approx(ref, rel=1e-9, abs=1e-12)


def raw_means(examples) -> tuple[int, int, float, float, float]:
    """Trained labels, examples with one, and the three rules over an epoch, from the raw rows."""
    per = [[float(i) for i, m in zip(ids[1:], mask[1:], strict=True) if m] for ids, mask in examples]
    per = [p for p in per if p]
    tokens = [v for p in per for v in p]
    return (len(tokens), len(per), sum(tokens) / len(tokens),
            sum(sum(p) / len(p) for p in per) / len(per), sum(map(sum, per)) / len(per))


@pytest.mark.parametrize("packing", [None, "bfd"])
def test_real_loader_epoch_equals_the_raw_examples(dst: Path, packing: str | None) -> None:
    # The fixture's labels are distinct ids (1000 * row + position): as "losses" they tell the
    # examples apart, so an epoch of batches must give the raw rows' three means exactly.
    batches = list(ParquetLoader(dst, batch_size=4, drop_last=False, packing=packing, seed=3))
    assert any((b["segment_ids"] == 0).any() for b in batches) if packing else True
    num_tokens, num_examples, *expected = raw_means(random_examples(50, seed=1))
    assert int(count_trained(batches)) == num_tokens
    assert int(count_examples(batches)) == num_examples
    counts = {token_mean_loss: num_tokens, example_mean_loss: num_examples, sequence_sum_loss: num_examples}
    for (rule, count), want in zip(counts.items(), expected, strict=True):
        losses = [torch.where(b["loss_mask"], b["y"].double(), GARBAGE) for b in batches]
        got = sum(float(rule(x, b, count)) for x, b in zip(losses, batches, strict=True))
        assert got == pytest.approx(want, rel=1e-12)


def test_real_loader_counts_by_position_for_both_targets(dst: Path) -> None:
    # segment_trained (written by the collate) equals the count of trained positions per segment.
    for target in ("y", "labels"):
        packing = PackOptions("bfd", target=target)
        for b in ParquetLoader(dst, batch_size=4, drop_last=False, packing=packing, seed=3):
            ones = torch.ones(b["segment_ids"].shape, dtype=torch.float64)
            _, counts = example_losses(ones, b)
            recount = {k: v for k, v in b.items() if k != "segment_trained"}
            sums, _ = example_losses(ones, recount)
            assert torch.equal(sums, counts.double())


def _ddp_rank(rank: int, store: str, out: str) -> None:
    """One rank of a real 2-process DDP step: 2 micro-batches, counts all_reduced by the helper."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(_tiny_model())
    micro = _micro_batches()[2 * rank : 2 * rank + 2]
    n = count_trained([b for _, b in micro])  # all_reduce over the 2 ranks
    for feats, batch in micro:
        token_mean_loss(model(feats).squeeze(-1), batch, n).backward()  # world_size: from dist
    torch.save({"n": int(n), "grad": model.module.weight.grad}, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def _tiny_model() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1, bias=False).double()


def _micro_batches() -> list[tuple[torch.Tensor, dict]]:
    """4 micro-batches (B = 2, T = 4) with 7, 1, 8 and 0 trained tokens."""
    gen = torch.Generator().manual_seed(5)
    masks = [[[1, 1, 1, 0], [1, 1, 1, 1]], [[0, 0, 1, 0], [0, 0, 0, 0]], [[1] * 4, [1] * 4], [[0] * 4] * 2]
    return [(torch.randn(2, 4, 3, generator=gen, dtype=torch.float64), padded([[0] * 4] * 2, m)[1])
            for m in masks]


def test_real_ddp_gradient_is_the_step_mean(tmp_path: Path) -> None:
    # Each rank is a fresh interpreter of its own, started together: nothing is forked. A fork
    # after OpenMP, Polars or torch._dynamo's import had started threads (the xdist worker's, or a
    # driver's) left a rank waiting forever on a lock no thread of the child holds (CI hung at 99%).
    # Importing torch and DDP's torch._dynamo costs each rank ~5-10 s, in parallel.
    rank = "import sys; from tests.train.test_loss import _ddp_rank; _ddp_rank(int(sys.argv[1]), *sys.argv[2:])"
    ranks = [subprocess.Popen([sys.executable, "-c", rank, str(r), str(tmp_path / "store"), str(tmp_path)],
                              cwd=Path(__file__).parents[2]) for r in range(2)]
    try:
        assert [p.wait(timeout=240) for p in ranks] == [0, 0]
    finally:
        for p in ranks:
            p.kill()
    model, micro = _tiny_model(), _micro_batches()
    trained = torch.cat([b["loss_mask"].reshape(-1) for _, b in micro])
    preds = torch.cat([model(f).reshape(-1) for f, _ in micro])
    preds[trained].mean().backward()  # the mean over all 16 trained tokens, in one process
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["n"] == 16
        assert torch.allclose(got["grad"], model.weight.grad, rtol=1e-12, atol=1e-12)
