"""An image's `pixel_values` as the Qwen2-VL image processor gives them, for the loader's workers.

`etl run` sizes images from their headers (`etl.images.vision`); training needs their pixels. Per
image, as transformers 5.23's `Qwen2VLImageProcessorPil` does after `load_image` (`decode_rgb`):
an image with transparency composited on white (its `convert_to_rgb`), resized with Pillow's
bicubic filter to the grid's size, rescaled (float64 x 1/255, then float32), normalized
((x - mean) / std in float32) and cut into patches in its order: merge blocks of
`merge x merge` patches row by row, each patch `C x temporal x patch x patch` (the one frame
repeated `temporal` times). Rescale and normalize are one lookup in a (C, 256) float32 table built
with those same operations (elementwise, so equal to the bit), on uint8 patches: the transpose
moves 1 byte a value instead of 4, and no float64 image is made (a 1000 x 1000 image: 24 MB less).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from PIL import Image

from etl.errors import EtlError
from etl.images.embed import Wording, checked_bytes
from etl.images.read import decode_rgb
from etl.images.vision import PREPROCESSOR_CONFIG, VisionRule
from etl.ingest.discover import is_uri

# Qwen2VLImageProcessor's class defaults (transformers 5.23: OPENAI_CLIP_MEAN / _STD, 1 / 255,
# PILImageResampling.BICUBIC), used for a key its preprocessor_config.json leaves out.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
RESCALE = 1 / 255
BICUBIC = int(Image.Resampling.BICUBIC)
CHANNELS = 3  # RGB: load_image converts every image
_WHITE = (255, 255, 255, 255)  # what convert_to_rgb composites transparency onto


class PixelRule(NamedTuple):
    """What the processor does to an image's pixels once `VisionRule` has chosen its size: the
    numbers of preprocessor_config.json that VisionRule does not hold."""

    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD
    rescale_factor: float = RESCALE
    resample: int = BICUBIC
    do_rescale: bool = True
    do_normalize: bool = True

    def table(self) -> np.ndarray:
        """(C, 256) float32: channel c's value v after rescale and normalize, the processor's own
        operations in its order (uint8 -> float64 x factor -> float32; (x - mean) / std in float32)."""
        values = np.arange(256, dtype=np.float64)
        x = (values * self.rescale_factor).astype(np.float32) if self.do_rescale else values.astype(np.float32)
        x = np.broadcast_to(x, (CHANNELS, 256))
        if self.do_normalize:
            mean = np.asarray(self.image_mean, dtype=np.float32)[:, None]
            std = np.asarray(self.image_std, dtype=np.float32)[:, None]
            x = (x - mean) / std
        return np.ascontiguousarray(x, dtype=np.float32)


def pixel_rule(config: Mapping[str, Any]) -> PixelRule:
    """The `PixelRule` of a preprocessor_config.json's keys (class defaults for those left out).

    Raises:
        EtlError: a mean or std that is not 3 numbers (std all non-zero), or a processor that does
            not resize or convert to RGB (etl mirrors only the one that does).
    """
    for key in ("do_resize", "do_convert_rgb"):
        if config.get(key) is False:
            raise EtlError(f"{key} is false: etl's pixel_values mirror a processor that resizes to the "
                           "grid and converts to RGB, as Qwen2-VL's published configs do")
    rule = PixelRule(
        image_mean=_channels(config.get("image_mean"), CLIP_MEAN), image_std=_channels(config.get("image_std"), CLIP_STD),
        rescale_factor=float(config.get("rescale_factor", RESCALE)), resample=int(config.get("resample", BICUBIC)),
        do_rescale=bool(config.get("do_rescale", True)), do_normalize=bool(config.get("do_normalize", True)))
    for name, values in (("image_mean", rule.image_mean), ("image_std", rule.image_std)):
        if len(values) != CHANNELS or not all(isinstance(v, (int, float)) for v in values):
            raise EtlError(f"{name} must be {CHANNELS} numbers (R, G, B), got {list(values)!r}")
    if 0 in rule.image_std:
        raise EtlError(f"image_std {list(rule.image_std)} holds a 0 (normalize divides by it)")
    return rule


def _channels(value: Any, default: tuple[float, ...]) -> tuple[float, ...]:
    """A mean or std as one number per channel: a single number is every channel's (as normalize takes it)."""
    if value is None:
        return default
    return (value,) * CHANNELS if isinstance(value, (int, float)) else tuple(value)


def load_pixel_rule(folder: str | Path) -> PixelRule | None:
    """The `PixelRule` of a model folder's preprocessor_config.json; None when it has none.

    Raises:
        EtlError: unreadable JSON, or values `pixel_rule` refuses (naming the file).
    """
    path = Path(folder) / PREPROCESSOR_CONFIG
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
        return pixel_rule(config)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
        raise EtlError(f"{path}: cannot read the image processor's pixel settings ({exc})") from exc
    except EtlError as exc:
        raise EtlError(f"{path}: {exc}") from exc


def processor_rgb(image: Image.Image) -> Image.Image:
    """transformers' `convert_to_rgb`: an image with an alpha band or a transparency key (a palette
    or tRNS colour, which Pillow keeps in `info` through `convert("RGB")`) is composited on white;
    any other is RGB already after `decode_rgb` (convert("RGB") would copy it: ~2.5 ms at 1411 x 1411)."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, _WHITE), rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def patchify(image: Image.Image, rule: VisionRule, grid: np.ndarray, pixels: PixelRule, table: np.ndarray,
             out: np.ndarray) -> None:
    """Write one decoded image's patch rows into ``out`` ((h * w, C * T * p * p) float32): resized
    to ``grid`` ([t, h, w] in patches) with the rule's filter, then looked up in ``table``."""
    p, m, t = rule.patch_size, rule.merge_size, rule.temporal_patch_size
    gh, gw = int(grid[1]), int(grid[2])
    resized = np.asarray(image.resize((gw * p, gh * p), resample=pixels.resample))
    # (H, W, C) -> (gh/m, gw/m, m, m, C, p, p): merge blocks row by row, then a block's patches.
    blocks = resized.reshape(gh // m, m, p, gw // m, m, p, CHANNELS).transpose(0, 3, 1, 4, 6, 2, 5)
    values = table[np.arange(CHANNELS)[:, None, None], blocks.reshape(gh * gw, CHANNELS, p, p)]
    out.reshape(gh * gw, CHANNELS, t, p, p)[:] = values[:, :, None]  # the one frame, `t` times


def pixel_values(images: Sequence[bytes], rule: VisionRule, grids: Any, pixels: PixelRule | None = None, *,
                 names: Sequence[str] | None = None) -> np.ndarray:
    """(sum of t * h * w, C * T * p * p) float32: the images' patch rows back to back, as
    `Qwen2VLImageProcessorPil` gives ``pixel_values`` for them (`load_image` first).

    Per-image work (decode, resize: ~2-20 ms an image) is what an image costs; the Python around
    it is a few calls an image. Each decoded image's size must give its ``grids`` row by
    ``rule.grid`` (the run sized it from the header: another size means other bytes).

    Args:
        images: each image file's bytes.
        rule: the processor's sizes (the run's manifest `images` block).
        grids: (N, 3) [t, h, w] patch grids, one per image (the ``image_grid_thw`` column).
        pixels: mean, std, rescale and filter (`load_pixel_rule`); default Qwen2-VL's.
        names: how errors name each image (default ``image k``).

    Raises:
        EtlError: an image that does not decode, or whose size gives another grid.
    """
    grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
    if len(grids) != len(images):
        raise EtlError(f"{len(images)} images but {len(grids)} grids")
    width = CHANNELS * rule.temporal_patch_size * rule.patch_size**2
    ends = np.cumsum(grids.prod(axis=1))
    out = np.empty((int(ends[-1]) if len(ends) else 0, width), dtype=np.float32)
    pixels = pixels or PixelRule()
    table = pixels.table()
    for k, data in enumerate(images):
        name = names[k] if names is not None else f"image {k}"
        image = _decoded(data, name)
        expected, ok = rule.grid(np.array([image.height]), np.array([image.width]))
        if grids[k, 0] != 1 or not ok[0] or not np.array_equal(expected[0], grids[k]):
            raise EtlError(f"{name}: decoded as {image.width}x{image.height}, which gives the grid "
                           f"{expected[0].tolist()}, not the {grids[k].tolist()} of the data: the bytes are not "
                           "the image `etl run` sized; rerun `etl run`")
        patchify(image, rule, grids[k], pixels, table, out[ends[k] - grids[k].prod(): ends[k]])
    return out


def _decoded(data: bytes, name: str) -> Image.Image:
    """`load_image` then the processor's `convert_to_rgb`; one-line error naming the image."""
    try:
        return processor_rgb(decode_rgb(data))
    except Exception as exc:  # any Pillow failure, named
        raise EtlError(f"{name}: cannot decode the image ({type(exc).__name__}: {exc})") from exc


# `--images reference` data read by the loader: the run recorded each file's sha256.
AFTER_RUN = Wording("image {where}: the file changed after `etl run` (its sha256 is not the one the run "
                    "recorded); restore it or rerun `etl run`",
                    "{detail}; `--images reference` data keeps paths, not bytes: restore the file, or rerun "
                    "`etl run` (--images embed keeps the bytes)")


def read_checked(paths: Sequence[str], sha256: Sequence[str]) -> list[bytes]:
    """The files of ``--images reference`` data, each checked against the sha256 `etl run` recorded.

    Raises:
        EtlError: a file that is missing, unreadable, or changed since the run (naming it).
    """
    # Threads overlap an object store's waits; for local files a pool costs more than it gives
    # (mllm_demo's JPEGs from the page cache, 11 a call: 0.37 ms an image with 8 threads, 0.06 with 1).
    threads = 8 if any(is_uri(p) for p in paths) else 1
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(lambda k: checked_bytes(paths[k], sha256[k], wording=AFTER_RUN), range(len(paths))))
