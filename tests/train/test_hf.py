"""hf_inputs: a real transformers model (tiny random Qwen2) trains on packed rows as on each example.

The data is a real `etl run` output (bytes tokenizer, ngpt template); the model is built from a
config in the test, in float64 and ``train()`` mode (dropout 0), so equal maths agrees to ~1e-12
(eager's softmax runs in float32: ~1e-7), far inside the 1e-5 asked. Every example of the first
packed batches is checked: its summed token loss and its gradient (the sum's, taken from the
packed forward) against the example run alone, unpadded, through the model's plain call.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from etl.cli import main
from etl.columns import IGNORE_INDEX, INPUT_IDS, LOSS_MASK
from etl.errors import EtlError, EtlWarning
from etl.loader import PackOptions, ParquetLoader
from etl.loader.collate_packed import collate_packed
from etl.ragged import PackedBatch, from_examples
from etl.train import hf_inputs

transformers = pytest.importorskip("transformers")

S = 160  # pack width: ~3 chats of 15-62 tokens a row, some rows padded
BATCHES = 3  # of 2 rows: ~18 examples per check

Docs = list[tuple[int, torch.Tensor, list[int], list[bool]]]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/train/conftest.py


@pytest.fixture(scope="module")
def dst(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf_inputs")
    rng = np.random.default_rng(0)
    with open(root / "chats.jsonl", "w", encoding="utf-8") as f:
        for i in range(24):
            turns = [{"role": "system", "content": "be brief."}] if i % 3 == 0 else []
            for t in range(int(rng.integers(1, 3))):
                turns += [{"role": "user", "content": f"q{i}.{t} " * int(rng.integers(1, 4))},
                          {"role": "assistant", "content": f"a{i}.{t} " * int(rng.integers(1, 5))}]
            f.write(json.dumps({"messages": turns}) + "\n")
    out = root / "dst"
    assert main(["run", str(root / "chats.jsonl"), str(out), "--seq-len", "64", "--template", "ngpt",
                 "--quiet"]) == 0
    return out


@pytest.fixture(scope="module")
def rows(dst: Path) -> dict[tuple[int, ...], list[bool]]:
    """Every example of the split: its ids -> its loss mask, as `etl run` wrote them."""
    table = pq.read_table(dst / "data" / "train", columns=[INPUT_IDS, LOSS_MASK])
    return {tuple(i): m for i, m in zip(table[INPUT_IDS].to_pylist(), table[LOSS_MASK].to_pylist(),
                                        strict=True)}


def vocab(dst: Path) -> int:
    return json.loads((dst / "_manifest.json").read_text())["tokenizer"]["vocab_size"]


def tiny_qwen2(vocab_size: int, impl: str, *, windowed: bool = False) -> torch.nn.Module:
    """2 layers, hidden 32, 4 heads over 2 kv heads, float64, seeded, train() with dropout 0.

    ``windowed``: the second layer slides a window of 8 tokens (shorter than every example).
    """
    window = {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1} if windowed else {}
    config = transformers.Qwen2Config(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.0, **window)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.Qwen2ForCausalLM._from_config(config, attn_implementation=impl)
    return model.double().train()


def packed(dst: Path, target: str = "y") -> list[dict[str, torch.Tensor]]:
    loader = ParquetLoader(dst, batch_size=2, packing=PackOptions("bfd", target=target), seq_len=S,
                           seed=0, drop_last=False)
    return list(loader)[:BATCHES]


def documents(batch: dict[str, torch.Tensor], rows: dict) -> Docs:
    """(row, x-columns, ids, mask) of every example of a y batch, found in the split by its ids.

    A segment's x tokens are its example's ids, less the last one where the example ends the
    pack (that token is only a label); bfd at S=160 never clips a 64-token example.
    """
    out = []
    for b, seg in enumerate(batch["segment_ids"]):
        for k in range(1, int(seg.max()) + 1):
            cols = (seg == k).nonzero().squeeze(1)
            xs = tuple(batch["x"][b, cols].tolist())
            found = [ids for ids in rows if ids in (xs, xs + (int(batch["y"][b, cols[-1]]),))]
            assert len(found) == 1, (b, k, xs)
            out.append((b, cols, list(found[0]), rows[found[0]]))
    return out


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B, W) loss of logits[i] against labels[i + 1] (the model's own shift), 0 where ignored."""
    shifted = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
    flat = F.cross_entropy(logits.flatten(0, 1).double(), shifted.flatten(), reduction="none",
                           ignore_index=IGNORE_INDEX)
    return flat.view(labels.shape)


def alone(model: torch.nn.Module, ids: list[int], mask: list[bool]) -> torch.Tensor:
    """The example on its own, unpadded, through the model's plain call: summed trained loss."""
    ids_t = torch.tensor([ids], device=model.device)
    labels = ids_t.where(torch.tensor([mask], device=model.device), IGNORE_INDEX)
    return token_losses(model(input_ids=ids_t, use_cache=False).logits, labels).sum()


def grads(loss: torch.Tensor, model: torch.nn.Module, *, retain: bool) -> torch.Tensor:
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.cat([g.flatten() for g in torch.autograd.grad(loss, params, retain_graph=retain)])


def check_packed_equals_alone(
    model: torch.nn.Module, batches: list, rows: dict, *, relative: bool = False
) -> tuple[float, float]:
    """Assert per-example loss and gradient equality to 1e-5; return the largest differences.

    ``relative``: 1e-5 of the value's magnitude (float32 on a GPU: a loss sum of ~50 holds ~7
    digits), else absolute.
    """
    worst_loss = worst_grad = 0.0
    checked = 0
    for batch in batches:
        kw = hf_inputs(batch, model)
        out = model(**kw)
        losses = token_losses(out.logits, kw["labels"].to(out.logits.device))
        docs = documents(batch, rows)
        total = torch.zeros((), dtype=torch.float64)
        for i, (b, cols, ids, mask) in enumerate(docs):
            got = losses[b, cols.to(losses.device)].sum()
            want = alone(model, ids, mask)
            total += want.detach().cpu()
            g_got, g_want = grads(got, model, retain=i < len(docs) - 1), grads(want, model, retain=False)
            scale = (max(1.0, abs(float(want.detach()))), max(1.0, float(g_want.abs().max())))
            scale = scale if relative else (1.0, 1.0)
            worst_loss = max(worst_loss, abs(float(got.detach() - want.detach())) / scale[0])
            worst_grad = max(worst_grad, float((g_got - g_want).abs().max()) / scale[1])
            checked += sum(mask[1:]) > 0
        # The model's own loss: its shift of `labels`, the mean over trained labels (in float32).
        trained = int((kw["labels"][:, 1:] != IGNORE_INDEX).sum())
        assert float(out.loss.detach()) == pytest.approx(float(total) / trained, rel=1e-5)
    assert worst_loss < 1e-5 and worst_grad < 1e-5, (worst_loss, worst_grad)
    assert checked >= 10  # not a comparison between zeros
    return worst_loss, worst_grad


@pytest.mark.parametrize("windowed", [False, True], ids=["full", "sliding-window"])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_packed_equals_each_example_alone(dst: Path, rows: dict, impl: str, windowed: bool) -> None:
    model = tiny_qwen2(vocab(dst), impl, windowed=windowed)
    batches = packed(dst)
    kw = hf_inputs(batches[0], model)
    assert ("attention_mask" in kw) is not windowed  # windows: transformers masks from positions
    if not windowed:
        assert kw["attention_mask"].dtype == (torch.bool if impl == "sdpa" else torch.float64)
    print(impl, windowed, "max |loss diff|, |grad diff|:", check_packed_equals_alone(model, batches, rows))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's backward needs CUDA")
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_flex_attention_packed_equals_each_example_alone(dst: Path, rows: dict) -> None:
    model = tiny_qwen2(vocab(dst), "flex_attention").float().cuda()  # the dtypes its kernels take
    batches = packed(dst)
    kw = hf_inputs(batches[0], model)
    assert type(kw["attention_mask"]).__name__ == "BlockMask" and kw["input_ids"].is_cuda
    worst = check_packed_equals_alone(model, batches, rows, relative=True)
    print("flex max relative loss diff, grad diff:", worst)


@torch.no_grad()
def test_the_bare_call_attends_across_documents(dst: Path, rows: dict) -> None:
    # model(input_ids, position_ids) with the default use_cache=True: transformers builds a
    # DynamicCache, and with a cache it does not look for packed documents in position_ids.
    # If a transformers release changes this, this test fails: say so in the hf_inputs docs.
    model = tiny_qwen2(vocab(dst), "sdpa")
    later = 0
    for batch in packed(dst):
        x, pos = batch["x"], batch["position_ids"]
        bare = model(input_ids=x, position_ids=pos).logits
        widened = hf_inputs(batch, model)["labels"]
        losses = token_losses(F.pad(bare, (0, 0, 0, 1)), widened)  # x/y -> the widened labels
        for b, cols, ids, mask in documents(batch, rows):
            diff = abs(float(losses[b, cols].sum() - alone(model, ids, mask)))
            if cols[0] == 0:  # a row's first document sees only itself anyway
                assert diff < 1e-5
            elif sum(mask[1:]):
                assert diff > 1e-3, "the bare call now keeps documents apart"
                later += 1
        no_cache = model(input_ids=x, position_ids=pos, use_cache=False).logits
        masked = model(**hf_inputs(batch, model)).logits[:, :-1]
        torch.testing.assert_close(no_cache, masked, rtol=0, atol=1e-10)  # detection from positions
    assert later >= 3


@torch.no_grad()
def test_labels_target_scores_what_the_y_target_scores(dst: Path) -> None:
    model = tiny_qwen2(vocab(dst), "sdpa")
    for y_batch, l_batch in zip(packed(dst), packed(dst, "labels"), strict=True):
        kw_y, kw_l = hf_inputs(y_batch, model), hf_inputs(l_batch, model)
        assert torch.equal(kw_l["input_ids"], l_batch["input_ids"])  # passed as they are
        assert torch.equal(kw_l["labels"], l_batch["labels"])
        width = kw_l["input_ids"].shape[1]  # T, or T + 1 = S where the collate keeps every token
        assert torch.equal(kw_l["labels"], kw_y["labels"][:, :width])
        got = token_losses(model(**kw_l).logits, kw_l["labels"])[:, : width - 1]
        want = token_losses(model(**kw_y).logits, kw_y["labels"])[:, : width - 1]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_flash_keywords_equal_data_collator_with_flattening() -> None:
    # One full row of three examples (S = 12), no padding: transformers' padding-free collator
    # on the same examples gives the same ids, labels, positions and varlen keywords.
    docs = [([5, 6, 7, 8], [0, 0, 1, 1]), ([9, 10, 11], [0, 1, 1]), ([12, 13, 14, 15, 16], [0, 0, 1, 1, 1])]
    pieces = from_examples([{INPUT_IDS: np.array(i), LOSS_MASK: np.array(m, bool)} for i, m in docs])
    batch = PackedBatch(pieces=pieces, row=np.zeros(3, np.int64), segment=np.arange(1, 4), num_rows=1)
    kw = hf_inputs(collate_packed(batch, seq_len=12, pad_id=0),
                   SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2"),
                                   parameters=lambda: iter(()), training=True))
    flat = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)(
        [{"input_ids": i, "labels": [t if k else IGNORE_INDEX for t, k in zip(i, m, strict=True)]}
         for i, m in docs])
    for key in ("input_ids", "labels", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k"):
        assert kw[key].tolist() == flat[key].tolist(), key
    assert kw["max_length_q"] == kw["max_length_k"] == flat["max_length_q"] == 5
    assert kw["use_cache"] is False and "attention_mask" not in kw


def test_padding_is_its_own_document() -> None:
    seg = torch.tensor([[1, 1, 2, 0, 0]])
    batch = {"x": torch.tensor([[3, 4, 5, 0, 0]]), "y": torch.tensor([[4, -100, -100, -100, -100]]),
             "loss_mask": torch.tensor([[True, False, False, False, False]]), "segment_ids": seg,
             "position_ids": torch.tensor([[0, 1, 0, 0, 1]])}
    kw = hf_inputs(batch, tiny_qwen2(8, "sdpa"))
    assert kw["input_ids"].tolist() == [[3, 4, 5, 0, 0, 0]]  # the ignored last label reads x's
    assert kw["labels"].tolist() == [[-100, 4, -100, -100, -100, -100]]
    assert kw["position_ids"].tolist() == [[0, 1, 0, 0, 1, 2]]
    mask = kw["attention_mask"][0, 0].int().tolist()
    assert mask[2] == [0, 0, 1, 0, 0, 0] and mask[5] == [0, 0, 0, 1, 1, 1]


def test_unpacked_batches_and_unknown_implementations_say_what_to_pass(dst: Path) -> None:
    model = tiny_qwen2(vocab(dst), "sdpa")
    padded = next(iter(ParquetLoader(dst, batch_size=2, seed=0)))
    with pytest.raises(EtlError, match="packing='bfd'"):
        hf_inputs(padded, model)
    model.config._attn_implementation = "paged|sdpa"
    with pytest.raises(EtlError, match="attn_implementation='sdpa'"):
        hf_inputs(packed(dst)[0], model)
    model.config._attn_implementation = "flex_attention"  # CPU, train(): the backward would raise
    with pytest.warns(EtlWarning, match="backward"):
        hf_inputs(packed(dst)[0], model)


@torch.no_grad()
@pytest.mark.parametrize("target", ["y", "labels"])
def test_loss_helpers_take_the_logits_of_hf_inputs_as_they_come(dst: Path, target: str) -> None:
    # hf_inputs widens a y batch by one column (T + 1 logits); the helpers align them, and the
    # token mean equals the model's own loss on the same keywords (transformers' shift and mean).
    from etl.train import token_losses as etl_token_losses
    from etl.train import token_mean_loss

    model = tiny_qwen2(vocab(dst), "sdpa")
    for batch in packed(dst, target):
        kw = hf_inputs(batch, model)
        out = model(**kw)
        assert out.logits.shape[1] == batch[target].shape[1] + (target == "y")
        losses = etl_token_losses(out.logits, batch)
        assert losses.shape == batch[target].shape
        assert float(token_mean_loss(losses, batch)) == pytest.approx(float(out.loss), rel=1e-6)  # float32 CE
    with pytest.raises(EtlError, match=r"T \+ 1 columns"):  # any other width is still refused
        etl_token_losses(out.logits[:, :-2], batch)
