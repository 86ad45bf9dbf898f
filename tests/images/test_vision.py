"""The image-token rule against transformers' own Qwen2-VL processor: the same patch grids for
real images (../shared) and for made ones of awkward sizes, the same refusals, and `smart_resize`
element by element over random sizes and bounds."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from etl.errors import EtlError
from etl.images.read import read_images
from etl.images.vision import MAX_RATIO, VISION, VisionRule, load_vision, qwen2_vl

transformers = pytest.importorskip("transformers")
from transformers import Qwen2VLImageProcessorPil
from transformers.image_utils import load_image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
QWEN_VL = SHARED / "qwen2.5-vl-processor"
IMAGES = SHARED / "images"
# Qwen3-VL's preprocessor_config.json (Qwen/Qwen3-VL-8B-Instruct): the same class, patch 16.
QWEN3_VL = {"image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 16, "merge_size": 2,
            "temporal_patch_size": 2, "size": {"longest_edge": 16777216, "shortest_edge": 65536}}
# (width, height) of made images: 1 pixel, thin, at the ratio limit and past it, under a patch.
AWKWARD = [(1, 1), (1, 3), (3, 1), (2, 2), (27, 27), (28, 28), (29, 57), (1, 200), (200, 1), (1, 201),
           (3, 601), (5, 1000), (10, 2001), (14, 14), (55, 56), (1000, 5), (333, 777), (1, 4),
           (70, 70), (42, 98)]  # 70 / 28 = 2.5 and 98 / 28 = 3.5: rounded half to even, as Python does


def rule_of(processor: Qwen2VLImageProcessorPil) -> VisionRule:
    """The rule for a transformers processor object's own numbers."""
    return qwen2_vl({"patch_size": processor.patch_size, "merge_size": processor.merge_size,
                     "temporal_patch_size": processor.temporal_patch_size,
                     "min_pixels": processor.size.shortest_edge, "max_pixels": processor.size.longest_edge})


def same(a: VisionRule, b: VisionRule) -> bool:
    """The same numbers and tokens (the processor's class name aside)."""
    return a[1:] == b[1:]


def processors() -> list[Qwen2VLImageProcessorPil]:
    """Qwen2.5-VL's defaults, a low max_pixels, a high min_pixels, and Qwen3-VL's patch 16."""
    return [Qwen2VLImageProcessorPil(),
            Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=200_000),
            Qwen2VLImageProcessorPil(min_pixels=300_000, max_pixels=1_000_000),
            Qwen2VLImageProcessorPil(patch_size=16, size={"shortest_edge": 65536, "longest_edge": 16777216})]


def reference_grid(processor: Qwen2VLImageProcessorPil, image: Image.Image) -> tuple[list[int], bool]:
    """transformers' image_grid_thw for one image, or ([0, 0, 0], False) when it refuses it."""
    try:
        return processor(image)["image_grid_thw"][0].tolist(), True
    except ValueError:
        return [0, 0, 0], False


def check(rule: VisionRule, processor: Qwen2VLImageProcessorPil, images: list[Image.Image]) -> None:
    """The rule's grids, refusals and token counts are the processor's for every image."""
    width = np.array([im.width for im in images])
    height = np.array([im.height for im in images])
    grid, ok = rule.grid(height, width)
    assert grid.dtype == np.int32 and grid.shape == (len(images), 3) and ok.dtype == np.bool_
    for i, image in enumerate(images):
        expected, accepted = reference_grid(processor, image)
        assert (grid[i].tolist(), bool(ok[i])) == (expected, accepted), image.size
        if accepted:
            patches = processor.get_number_of_image_patches(image.height, image.width)
            assert rule.tokens(grid[i : i + 1])[0] == patches // processor.merge_size**2


@pytest.mark.parametrize("processor", processors(), ids=["default", "low-max", "high-min", "qwen3-vl"])
def test_awkward_sizes_match_the_processor(processor: Qwen2VLImageProcessorPil) -> None:
    """Tiny images are scaled up (transformers 5.23 does not refuse a side under the factor), a
    ratio over 200 is refused, exactly 200 is not."""
    check(rule_of(processor), processor, [Image.new("RGB", size, "gray") for size in AWKWARD])


def test_refusals() -> None:
    rule = rule_of(Qwen2VLImageProcessorPil())
    grid, ok = rule.grid(np.array([1, 1, 0, 5, -3, 201, 200]), np.array([200, 201, 7, 0, 4, 1, 1]))
    assert ok.tolist() == [True, False, False, False, False, False, True]
    assert (grid[~ok] == 0).all() and rule.tokens(grid).tolist()[1:6] == [0] * 5
    assert MAX_RATIO == 200


@pytest.mark.shared
@pytest.mark.skipif(not QWEN_VL.is_dir(), reason="../shared/data is absent")
def test_shared_images_match_the_shared_processor() -> None:
    """Every readable ../shared image, its size read from the header, with Qwen2.5-VL's own
    processor folder and the constructed ones."""
    paths = sorted(p for p in IMAGES.rglob("*") if p.suffix in {".png", ".jpg", ".gif", ".tif"})
    sizes = read_images([str(p) for p in paths], base=None, root=None, keep_bytes=False)
    readable = [p for p, reason in zip(paths, sizes["reason"].to_pylist()) if reason is None]
    assert len(paths) == 30 and len(readable) == 29  # multipage_rgb.tif: Pillow cannot open it
    images = [load_image(str(p)) for p in readable]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Qwen2VLImageProcessor falls back to the Pil class
        shared = transformers.Qwen2VLImageProcessor.from_pretrained(QWEN_VL)
    rule = load_vision(QWEN_VL)
    assert same(rule, rule_of(shared)) and rule.processor == "Qwen2VLImageProcessor"
    kept = sizes.filter(sizes["reason"].is_null())
    grid, ok = rule.grid(kept["height"].to_numpy(), kept["width"].to_numpy())
    assert ok.all()
    assert grid.tolist() == [shared(im)["image_grid_thw"][0].tolist() for im in images]
    for processor in processors()[1:]:
        check(rule_of(processor), processor, images)


# Sides of any size, and odd multiples of 14: half of a factor 28, where rounding goes to even.
SIDE = st.one_of(st.integers(0, 60_000), st.integers(0, 300).map(lambda k: 14 * (2 * k + 1)))


@settings(max_examples=300, deadline=None)
@given(sides=st.lists(st.tuples(SIDE, SIDE), min_size=1, max_size=40),
       low=st.integers(1, 2_000_000), span=st.integers(0, 20_000_000), patch=st.sampled_from([14, 16]),
       merge=st.sampled_from([1, 2]))
def test_grid_is_smart_resize_element_wise(sides: list[tuple[int, int]], low: int, span: int, patch: int,
                                           merge: int) -> None:
    """transformers raising (ValueError; ZeroDivisionError for a side of 0) <=> ok False."""
    rule = qwen2_vl({"patch_size": patch, "merge_size": merge, "min_pixels": low, "max_pixels": low + span})
    height, width = np.array(sides).T
    grid, ok = rule.grid(height, width)
    for (h, w), row, accepted in zip(sides, grid.tolist(), ok.tolist()):
        try:
            h_bar, w_bar = smart_resize(h, w, patch * merge, low, low + span)
            expected = [1, h_bar // patch, w_bar // patch]
        except (ValueError, ZeroDivisionError):
            expected = [0, 0, 0]
        assert (row, accepted) == (expected, expected != [0, 0, 0]), (h, w)


def write_config(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "preprocessor_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def test_load_vision_reads_the_config_as_transformers_does(tmp_path: Path) -> None:
    assert load_vision(tmp_path) is None  # no preprocessor_config.json: a text model
    qwen3 = load_vision(write_config(tmp_path / "q3", QWEN3_VL))
    assert (qwen3.patch_size, qwen3.min_pixels, qwen3.max_pixels) == (16, 65536, 16777216)
    assert same(qwen3, rule_of(Qwen2VLImageProcessorPil.from_pretrained(tmp_path / "q3")))
    assert (qwen3.image_token, qwen3.start, qwen3.end) == ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>")
    both = {**QWEN3_VL, "min_pixels": 1000, "image_processor_type": "Qwen2VLImageProcessorPil"}
    rule = load_vision(write_config(tmp_path / "both", both))  # top-level min_pixels over size
    assert same(rule, rule_of(Qwen2VLImageProcessorPil.from_pretrained(tmp_path / "both")))
    assert rule.min_pixels == 1000
    bare = load_vision(write_config(tmp_path / "bare", {"image_processor_type": "Qwen2VLImageProcessor"}))
    assert same(bare, rule_of(Qwen2VLImageProcessorPil())) and bare.max_pixels == 28 * 28 * 1280
    assert set(VISION) == {"Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast", "Qwen2VLImageProcessorPil"}


def test_overrides_replace_the_config(tmp_path: Path) -> None:
    folder = write_config(tmp_path, QWEN3_VL)
    rule = load_vision(folder, min_pixels=4096, max_pixels=100_000)
    assert (rule.min_pixels, rule.max_pixels, rule.patch_size) == (4096, 100_000, 16)
    assert load_vision(folder, max_pixels=70_000).min_pixels == 65536
    with pytest.raises(EtlError, match=r"preprocessor_config.json: min_pixels 65536 is over max_pixels 1000 .*; give"):
        load_vision(folder, max_pixels=1000)
    with pytest.raises(EtlError, match="min_pixels must be a positive integer, got -1"):
        load_vision(folder, min_pixels=-1)


def test_configs_etl_refuses(tmp_path: Path) -> None:
    unknown = write_config(tmp_path / "clip", {"image_processor_type": "CLIPImageProcessor"})
    with pytest.raises(EtlError, match=r"clip/preprocessor_config.json: image_processor_type 'CLIPImageProcessor'"
                                       r" is not one etl knows \(Qwen2VLImageProcessor, "):
        load_vision(unknown)
    half = write_config(tmp_path / "half", {"image_processor_type": "Qwen2VLImageProcessor",
                                            "size": {"shortest_edge": 1000}})
    with pytest.raises(EtlError, match="no min/max pixels"):  # transformers refuses it at the first image
        load_vision(half)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "preprocessor_config.json").write_text("{", encoding="utf-8")
    with pytest.raises(EtlError, match="cannot read it as JSON"):
        load_vision(tmp_path / "bad")
