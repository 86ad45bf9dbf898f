"""Image data in the loader: `pixel_values` and `image_grid_thw` equal transformers'
`Qwen2VLImageProcessorPil` on the same images (after `load_image`), per image and per batch (the
batch's rows in order, packs in the order of their documents), decoded in the workers; reference
data is checked against its sha256; nothing may cut an image example."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from etl.errors import EtlError, EtlWarning
from etl.images import pixels as pixels_module
from etl.images.pixels import PixelRule, load_pixel_rule, pixel_rule, pixel_values
from etl.images.read import header_size
from etl.images.vision import VisionRule, load_vision
from etl.loader import PackOptions, PadOptions, ParquetDataset, ParquetLoader, collate
from etl.loader.pack_request import PackRequest
from tests.loader.vision_data import image_bytes, run_vl

transformers = pytest.importorskip("transformers")
SKIMAGE = Path(__file__).resolve().parents[3] / "shared" / "data" / "images" / "scikit-image"
RULE = VisionRule("Qwen2VLImageProcessor", 14, 2, 2, 3136, 64 * 28 * 28, "<|image_pad|>", "<|vision_start|>",
                  "<|vision_end|>")


def processor(rule: VisionRule = RULE, pixels: PixelRule | None = None) -> object:
    pixels = pixels or PixelRule()
    return transformers.Qwen2VLImageProcessorPil(
        min_pixels=rule.min_pixels, max_pixels=rule.max_pixels, image_mean=list(pixels.image_mean),
        image_std=list(pixels.image_std))


def expected(files: list[Path], proc: object) -> tuple[np.ndarray, np.ndarray]:
    """transformers' pixel_values and image_grid_thw of the files, each read with load_image."""
    from transformers.image_utils import load_image

    if not files:
        return np.zeros((0, 1176), np.float32), np.zeros((0, 3), np.int64)
    out = proc(images=[load_image(str(f)) for f in files], return_tensors="np")  # type: ignore[operator]
    return out["pixel_values"], out["image_grid_thw"]


def made_images(folder: Path) -> list[Path]:
    """Images in every mode load_image meets: grey, alpha, a palette and an RGB with a transparent
    colour (the processor composites those on white), EXIF-rotated, 1x1, 60:1, over max_pixels."""
    folder.mkdir(exist_ok=True)
    files = {"rgb.png": image_bytes(61, 47), "grey.png": image_bytes(100, 90, "L", seed=1),
             "alpha.png": image_bytes(33, 57, "RGBA", seed=2), "palette.png": image_bytes(120, 64, "P", seed=3),
             "la.png": image_bytes(50, 50, "LA", seed=4), "jpeg.jpg": image_bytes(300, 200, seed=5, fmt="JPEG"),
             "dot.png": image_bytes(1, 1, seed=6), "wide.png": image_bytes(600, 10, seed=7),
             "big.png": image_bytes(700, 500, seed=8)}
    trns = Image.open(io.BytesIO(image_bytes(40, 30, seed=9))).convert("RGB")
    out = io.BytesIO()
    trns.save(out, "PNG", transparency=tuple(trns.getpixel((0, 0))))
    files["trns.png"] = out.getvalue()
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90: width and height swap
    out = io.BytesIO()
    Image.open(io.BytesIO(image_bytes(70, 40, seed=10))).save(out, "JPEG", exif=exif)
    files["rotated.jpg"] = out.getvalue()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return [folder / name for name in files]


def grids_of(files: list[Path], rule: VisionRule) -> np.ndarray:
    sizes = np.array([header_size(f.read_bytes()) for f in files])
    grid, ok = rule.grid(sizes[:, 1], sizes[:, 0])
    assert ok.all()
    return grid


def test_pixel_values_equal_the_processor_on_made_images(tmp_path: Path) -> None:
    files = made_images(tmp_path / "made")
    pixels = PixelRule(image_mean=(0.5, 0.4, 0.3), image_std=(0.2, 0.25, 0.3))  # not the defaults
    for rule_pixels in (PixelRule(), pixels):
        want, want_grid = expected(files, processor(RULE, rule_pixels))
        got = pixel_values([f.read_bytes() for f in files], RULE, grids_of(files, RULE), rule_pixels)
        np.testing.assert_array_equal(grids_of(files, RULE), want_grid)
        assert got.dtype == np.float32 and got.shape == want.shape
        print("made images, max |diff|:", float(np.abs(got - want).max()))
        assert float(np.abs(got - want).max()) <= 1e-6


def readable(path: Path) -> bool:
    """Pillow opens it (not the licence text, nor the one TIFF it cannot open)."""
    try:
        Image.open(path).close()
    except OSError:  # UnidentifiedImageError is one
        return False
    return True


@pytest.mark.skipif(not SKIMAGE.is_dir(), reason="../shared/data/images/scikit-image is absent")
def test_pixel_values_equal_the_processor_on_scikit_image() -> None:
    folder = SKIMAGE.parents[1] / "qwen2.5-vl-processor"
    rule = load_vision(folder) if folder.is_dir() else RULE._replace(max_pixels=12845056)
    pixels = (load_pixel_rule(folder) if folder.is_dir() else None) or PixelRule()
    proc = processor(rule, pixels)
    worst, seen = 0.0, 0
    for path in filter(readable, sorted(SKIMAGE.iterdir())):
        want, want_grid = expected([path], proc)
        got = pixel_values([path.read_bytes()], rule, want_grid, pixels)
        worst, seen = max(worst, float(np.abs(got - want).max())), seen + 1
    print(f"scikit-image, {seen} images, max |diff|:", worst)
    assert seen >= 25 and worst <= 1e-6


def test_an_image_of_another_size_is_named(tmp_path: Path) -> None:
    data = image_bytes(60, 40)
    with pytest.raises(EtlError, match=r"photo\.png: decoded as 60x40"):
        pixel_values([data], RULE, [[1, 8, 8]], names=["photo.png"])
    with pytest.raises(EtlError, match="cannot decode"):
        pixel_values([b"not an image"], RULE, [[1, 2, 2]])


@pytest.fixture(scope="module")
def vl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_vl(tmp_path_factory.mktemp("vl_loader"), 12, "--seq-len", "256")


def split_rows(dst: Path) -> dict[tuple[int, ...], list[Path]]:
    """Every example of the split: its ids -> its image files, read from the Parquet here."""
    table = pq.read_table(dst / "data" / "train", columns=["input_ids", "images"])
    images = dst.parent / "images"
    return {tuple(ids): [images / Path(i["path"]).name for i in imgs]
            for ids, imgs in zip(table["input_ids"].to_pylist(), table["images"].to_pylist(), strict=True)}


def documents(batch: dict[str, torch.Tensor], rows: dict) -> list[tuple[int, ...]]:
    """The examples of a batch in order: padded rows, or each packed row's documents."""
    x = batch["x"]
    if "segment_ids" not in batch:
        keys = [tuple(r[m].tolist()) for r, m in zip(x, batch["attention_mask"], strict=True)]
    else:
        keys = [tuple(x[b, seg == k].tolist()) for b, seg in enumerate(batch["segment_ids"])
                for k in range(1, int(seg.max()) + 1)]
    found = [[ids for ids in rows if ids[: len(key)] == key and len(ids) - len(key) <= 1] for key in keys]
    assert all(len(f) == 1 for f in found)
    return [f[0] for f in found]


def check_batches(loader: ParquetLoader, rows: dict, proc: object) -> int:
    images = 0
    for batch in loader:
        files = [f for ids in documents(batch, rows) for f in rows[ids]]
        want, want_grid = expected(files, proc)
        assert batch["image_grid_thw"].dtype == torch.int64 and batch["pixel_values"].dtype == torch.float32
        np.testing.assert_array_equal(batch["image_grid_thw"].numpy(), want_grid)
        assert float(np.abs(batch["pixel_values"].numpy() - want).max(initial=0)) <= 1e-6
        images += len(files)
    return images


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mode", ["fixed", "longest", "bfd", "ffd"])
def test_batches_carry_their_rows_images_in_order(vl: Path, mode: str, workers: int,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    if workers:  # decoding happens in the workers (forked: the patch goes with them), never here
        main, decode = os.getpid(), pixels_module.pixel_values

        def in_worker(*args: object, **kw: object) -> np.ndarray:
            assert os.getpid() != main, "decoded in the training process"
            return decode(*args, **kw)  # type: ignore[arg-type]
        monkeypatch.setattr(pixels_module, "pixel_values", in_worker)
    shape = {"packing": PackOptions(mode)} if mode in ("bfd", "ffd") else {"collate": PadOptions(mode)}
    loader = ParquetLoader(vl, batch_size=3, num_workers=workers, drop_last=False, **shape)
    proc = processor(load_vision(vl.parent / "vl"), load_pixel_rule(vl.parent / "vl"))
    assert check_batches(loader, split_rows(vl), proc) == 12  # 8 rows with 1 or 2 images


def test_items_and_their_collate_carry_images(vl: Path) -> None:
    ds = ParquetDataset(vl)
    items = [ds[i] for i in range(3)]
    assert [len(item["image_grid_thw"]) for item in items] == [1, 2, 0]
    batch = collate(items, seq_len=128, pad_id=0)
    np.testing.assert_array_equal(batch["image_grid_thw"], np.concatenate([i["image_grid_thw"] for i in items]))
    assert batch["pixel_values"].shape[0] == int(batch["image_grid_thw"].prod(1).sum())


def test_reference_images_are_read_and_checked(tmp_path: Path) -> None:
    dst = run_vl(tmp_path, 6, "--images", "reference", "--seq-len", "256")
    rows, proc = split_rows(dst), processor(load_vision(tmp_path / "vl"), load_pixel_rule(tmp_path / "vl"))
    loader = ParquetLoader(dst, batch_size=2, shuffle=False)
    assert check_batches(loader, rows, proc) == 6
    changed = tmp_path / "images" / "img1.png"
    changed.write_bytes(image_bytes(100, 90, "L", seed=99))  # same size, other pixels
    with pytest.raises(EtlError, match=r"img1\.png: the file changed after `etl run`"):
        list(loader)
    changed.unlink()
    with pytest.raises(EtlError, match=r"img1\.png.*no such file"):
        list(loader)


def test_nothing_may_cut_an_image_example(vl: Path) -> None:
    for strategy in ("sequential", "stream"):
        with pytest.raises(EtlError, match="cuts examples across rows"):
            ParquetLoader(vl, batch_size=2, packing=strategy)
    with pytest.raises(EtlError, match="would cut an example with images"), pytest.warns(UserWarning):
        ParquetLoader(vl, batch_size=2, seq_len=80)
    ds = ParquetDataset(vl)
    one = np.array([0])  # row 0 has an image: a piece of it (from token 1) is refused at its batch
    with pytest.raises(EtlError, match="a pack cuts an example with images"):
        ds.__getitems__(PackRequest(rows=one, start=one + 1, length=one + 10, row=one, segment=one + 1, num_rows=1))
    text_only = np.array([2])  # a text example may still be cut
    batch = ds.__getitems__(PackRequest(rows=text_only, start=one + 1, length=one + 10, row=one,
                                        segment=one + 1, num_rows=1))
    assert len(batch.image_grid_thw) == 0 and batch.pixel_values.shape == (0, 1176)


def test_the_pixel_rule_comes_from_the_processor_folder(vl: Path, tmp_path: Path) -> None:
    from etl.loader.images import manifest_rules
    from etl.output.manifest import read_manifest

    assert load_pixel_rule(vl.parent / "vl") == PixelRule()  # the folder writes CLIP's numbers
    assert load_pixel_rule(tmp_path) is None
    manifest = read_manifest(vl)
    rule, pixels = manifest_rules(manifest)
    assert rule == load_vision(vl.parent / "vl") and pixels == PixelRule()
    assert manifest["images"]["image_mean"] == list(PixelRule().image_mean)  # etl run writes them
    block = {k: v for k, v in manifest["images"].items() if k not in PixelRule._fields}  # an older manifest
    moved = manifest | {"tokenizer": {"name": str(tmp_path / "elsewhere")}, "images": block}
    with pytest.warns(EtlWarning, match="default mean/std"):
        assert manifest_rules(moved)[1] == PixelRule()
    mine = PixelRule(image_mean=(0.5, 0.5, 0.5))
    assert manifest_rules(moved, mine)[1] == mine  # given: no folder needed
    for config, match in (({"image_mean": [1, 2]}, "3 numbers"), ({"image_std": [0.2, 0, 0.2]}, "holds a 0"),
                          ({"do_resize": False}, "resizes")):
        with pytest.raises(EtlError, match=match):
            pixel_rule(config)
    assert pixel_rule({"image_mean": 0.5}).image_mean == (0.5, 0.5, 0.5)
