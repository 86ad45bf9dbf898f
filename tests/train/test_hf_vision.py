"""hf_inputs with images: tiny random Qwen2-VL and Qwen2.5-VL models train on packed rows as on
each example alone, called as transformers' processor would call them.

The data is a real `etl run` of image chats (a tokenizer and image processor folder made in
`tests.loader.vision_data`). Alone, each example gets the processor's inputs: its ids, an all-ones
attention mask, ``mm_token_type_ids`` (1 on image tokens) and ``Qwen2VLImageProcessorPil``'s
pixel values for its image files, so the model computes its own 3-D positions
(``get_rope_index``). Packed, it gets `hf_inputs` of a `ParquetLoader` batch. Models run in
float64, ``train()`` with dropout 0, one thread.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from transformers.image_utils import load_image

from etl.errors import EtlError
from etl.loader import PackOptions, ParquetDataset, ParquetLoader, TorchCollate
from etl.loader.pack_request import PackRequest
from etl.train import hf_inputs
from etl.train.hf import mrope_positions
from tests.loader.vision_data import run_vl
from tests.train.test_hf import token_losses

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/train/conftest.py

IMAGE, START, END, VIDEO = 5, 3, 4, 294  # the ids of the folder's tokenizer (run_vl's manifest says so)


@pytest.fixture(scope="module")
def vl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = run_vl(tmp_path_factory.mktemp("hf_vision"), 12, "--seq-len", "256")
    return dst


@pytest.fixture(scope="module")
def rows(vl: Path) -> dict[tuple[int, ...], tuple[list[bool], list[Path]]]:
    """Every example: its ids -> its loss mask and image files (read from the Parquet here)."""
    table = pq.read_table(vl / "data" / "train", columns=["input_ids", "loss_mask", "images"])
    images = vl.parent / "images"
    return {tuple(i): (m, [images / Path(x["path"]).name for x in imgs]) for i, m, imgs in
            zip(table["input_ids"].to_pylist(), table["loss_mask"].to_pylist(), table["images"].to_pylist(),
                strict=True)}


def tiny_vl(family: str, impl: str = "sdpa", *, windowed: bool = False) -> torch.nn.Module:
    """2 text layers (hidden 32, 4 heads over 2 kv heads, mRoPE sections 2+1+1 of 4), a 1-2 block
    vision tower of width 32; rope_theta 100 so that positions matter to a random model.

    ``windowed``: the second text layer slides a window of 8 tokens (transformers then masks
    from the text row of the 4-row positions: hf_inputs gives no mask)."""
    text = {"vocab_size": 295, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "bos_token_id": None, "eos_token_id": None,
            "num_attention_heads": 4, "num_key_value_heads": 2, "attention_dropout": 0.0,
            "rope_parameters": {"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 100.0}}
    if windowed:
        text |= {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}
    if family == "qwen2_vl":
        vision = {"depth": 1, "embed_dim": 32, "hidden_size": 32, "num_heads": 2, "mlp_ratio": 2}
        config_cls, model_cls = transformers.Qwen2VLConfig, transformers.Qwen2VLForConditionalGeneration
    else:  # a windowed block and a full one
        vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 32,
                  "window_size": 56, "fullatt_block_indexes": [1]}
        config_cls, model_cls = transformers.Qwen2_5_VLConfig, transformers.Qwen2_5_VLForConditionalGeneration
    config = config_cls(text_config=text, vision_config=vision, image_token_id=IMAGE, video_token_id=VIDEO,
                        vision_start_token_id=START, vision_end_token_id=END)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = model_cls._from_config(config, attn_implementation=impl)
    return model.double().train()


def grads(loss: torch.Tensor, model: torch.nn.Module, *, retain: bool) -> torch.Tensor:
    """d loss / d every parameter, flat; 0 for those it does not reach (a text example: the vision tower)."""
    params = list(model.parameters())
    found = torch.autograd.grad(loss, params, retain_graph=retain, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for p, g in zip(params, found, strict=True)])


def packed(vl: Path) -> list[dict[str, torch.Tensor]]:
    return list(ParquetLoader(vl, batch_size=2, packing=PackOptions("bfd"), seed=0, drop_last=False))


def documents(batch: dict[str, torch.Tensor], rows: dict) -> list[tuple[int, torch.Tensor, tuple[int, ...]]]:
    """(row, x columns, ids) of every document of a packed batch, found in the split by its ids."""
    out = []
    for b, seg in enumerate(batch["segment_ids"]):
        for k in range(1, int(seg.max()) + 1):
            cols = (seg == k).nonzero().squeeze(1)
            xs = tuple(batch["x"][b, cols].tolist())
            found = [ids for ids in rows if ids in (xs, xs + (int(batch["y"][b, cols[-1]]),))]
            assert len(found) == 1
            out.append((b, cols, found[0]))
    return out


def processor_inputs(ids: tuple[int, ...], files: list[Path], folder: Path) -> dict[str, torch.Tensor]:
    """What the processor gives for one example: ids, mask, mm_token_type_ids, pixels, grids."""
    ids_t = torch.tensor([ids])
    kw = {"input_ids": ids_t, "attention_mask": torch.ones_like(ids_t), "mm_token_type_ids": (ids_t == IMAGE).int(),
          "use_cache": False}
    if files:
        proc = transformers.Qwen2VLImageProcessorPil.from_pretrained(folder)
        kw |= dict(proc(images=[load_image(str(f)) for f in files], return_tensors="pt"))
    return kw


@pytest.mark.parametrize(("family", "windowed"), [("qwen2_vl", False), ("qwen2_5_vl", False), ("qwen2_vl", True)])
def test_packed_equals_each_example_alone(vl: Path, rows: dict, family: str, windowed: bool) -> None:
    model = tiny_vl(family, windowed=windowed)
    worst_loss = worst_grad = one_d = swapped = 0.0
    with_images = 0
    for batch in packed(vl):
        kw = hf_inputs(batch, model)
        assert kw["position_ids"].shape == (4, *kw["input_ids"].shape)
        assert ("attention_mask" in kw) is not windowed
        out = model(**kw)
        losses = token_losses(out.logits, kw["labels"])
        # Controls: the 1-D positions transformers falls back to, and the pixels in reverse order.
        flat = token_losses(model(**(kw | {"position_ids": kw["position_ids"][0]})).logits, kw["labels"]).detach()
        flip = token_losses(model(**(kw | {"pixel_values": kw["pixel_values"].flip(0)})).logits, kw["labels"]).detach()
        docs = documents(batch, rows)
        for i, (b, cols, ids) in enumerate(docs):
            mask, files = rows[ids]
            got = losses[b, cols].sum()
            labels = torch.tensor([ids]).where(torch.tensor([mask]), -100)
            want = token_losses(model(**processor_inputs(ids, files, vl.parent / "vl")).logits, labels).sum()
            g_got, g_want = grads(got, model, retain=i < len(docs) - 1), grads(want, model, retain=False)
            worst_loss = max(worst_loss, abs(float(got.detach() - want.detach())))
            worst_grad = max(worst_grad, float((g_got - g_want).abs().max()))
            if files:
                one_d = max(one_d, abs(float(flat[b, cols].sum() - want.detach())))
                swapped = max(swapped, abs(float(flip[b, cols].sum() - want.detach())))
            with_images += bool(files)
    print(family, "windowed" * windowed, "max |loss diff|, |grad diff|:", worst_loss, worst_grad, "; controls, 1-D positions:", one_d,
          "reversed pixels:", swapped)
    assert worst_loss < 1e-9 and worst_grad < 1e-9 and with_images == 8
    assert one_d > 1e-4 and swapped > 1e-4


def test_positions_equal_get_rope_index_per_document(vl: Path, rows: dict) -> None:
    model = tiny_vl("qwen2_vl")
    for batch in packed(vl):
        kw = hf_inputs(batch, model)
        for b, cols, ids in documents(batch, rows):
            alone = processor_inputs(ids, rows[ids][1], vl.parent / "vl")
            want, _ = model.model.get_rope_index(alone["input_ids"], alone["mm_token_type_ids"],
                                                 image_grid_thw=alone.get("image_grid_thw"))
            assert torch.equal(kw["position_ids"][1:, b, cols], want[:, 0, : len(cols)])
            assert torch.equal(kw["position_ids"][0, b, cols], torch.arange(len(cols)))  # the text row


def test_images_need_a_model_and_data_that_agree(vl: Path) -> None:
    batch = packed(vl)[0]
    with pytest.raises(EtlError, match="not 'qwen2'"):
        hf_inputs(batch, transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            vocab_size=295, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)))
    model = tiny_vl("qwen2_vl")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(EtlError, match="vision tower"):
        hf_inputs(batch, model)
    grids = batch["image_grid_thw"]
    with pytest.raises(EtlError, match="spatial_merge_size"):  # a merge of 1: 4x the tokens per image
        mrope_positions(batch["x"], batch["segment_ids"], grids, image_token_id=IMAGE, merge=1)
    text_only = mrope_positions(batch["x"], batch["segment_ids"], grids[:0], image_token_id=-1, merge=2)
    assert torch.equal(text_only, batch["position_ids"].expand(3, -1, -1))


def test_a_batch_of_text_rows_from_image_data(vl: Path, rows: dict) -> None:
    # Rows 2, 5, 8 have no image: their batch has 0 images, which the vision tower cannot take.
    ds, three = ParquetDataset(vl), np.arange(3)
    request = PackRequest(rows=np.array([2, 5, 8]), start=three * 0, length=ds.example_lengths()[[2, 5, 8]],
                          row=three * 0, segment=three + 1, num_rows=1)
    batch = TorchCollate("packed", {"seq_len": 256, "pad_id": 0})(ds.__getitems__(request))
    assert batch["pixel_values"].shape == (0, 1176)
    model = tiny_vl("qwen2_vl")
    kw = hf_inputs(batch, model)
    assert "pixel_values" not in kw and kw["position_ids"].shape[0] == 4
    losses = token_losses(model(**kw).logits, kw["labels"])
    for b, cols, ids in documents(batch, rows):
        labels = torch.tensor([ids]).where(torch.tensor([rows[ids][0]]), -100)
        want = token_losses(model(**processor_inputs(ids, [], vl.parent / "vl")).logits, labels).sum()
        assert abs(float((losses[b, cols].sum() - want).detach())) < 1e-9
