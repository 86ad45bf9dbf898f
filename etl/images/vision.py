"""How many tokens an image becomes: the image processor's resize rule, per processor class.

A model folder's preprocessor_config.json names its image processor (`image_processor_type`);
`VISION` maps that class name to a builder of a `VisionRule`, which turns image sizes into the
processor's patch grids and token counts without decoding a pixel. Qwen2-VL, Qwen2.5-VL and
Qwen3-VL share one processor class (transformers 5.23 registers `Qwen2VLImageProcessor` for
all three): their configs differ only in numbers (Qwen3-VL: patch 16), which the rule reads.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from etl.errors import EtlError

PREPROCESSOR_CONFIG = "preprocessor_config.json"
# transformers' smart_resize refuses an image whose longer side is more than this many times its
# shorter one (ValueError "absolute aspect ratio must be smaller than 200"); exactly 200 passes.
MAX_RATIO = 200
# Qwen2VLImageProcessor's class defaults, used for a key its config leaves out (transformers 5.23).
_QWEN2_VL_DEFAULTS = {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2,
                      "shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}
# The processors' defaults (a tokenizer may name others; Qwen's do not).
_QWEN_TOKENS = {"image_token": "<|image_pad|>", "start": "<|vision_start|>",
                "end": "<|vision_end|>"}


class VisionRule(NamedTuple):
    """One processor's numbers: how it resizes an image and which tokens stand for it."""

    processor: str  # image processor class from preprocessor_config.json
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int
    image_token: str  # repeated once per merged patch
    start: str  # before the image tokens
    end: str  # after them

    def grid(self, height: np.ndarray, width: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(N, 3) int32 `[t, h, w]` patch grids (t = 1: an image is one frame) and (N,) bool `ok`.

        transformers' Qwen2-VL `smart_resize`, vectorized: sides rounded (half to even, as Python's
        `round`) to `factor = patch * merge`; scaled down with floor when the area passes
        `max_pixels`, up with ceil when under `min_pixels`. The same float64 operations in the same
        order, so each side matches it exactly. A row it refuses gets ok False and grid 0: a side
        of 0 or less (it divides by the shorter side) or a ratio of sides over MAX_RATIO. A side
        under `factor` is not refused (transformers 5.23 scales a 1x1 image up to 56x56).
        """
        h = np.asarray(height, dtype=np.int64)
        w = np.asarray(width, dtype=np.int64)
        factor = self.patch_size * self.merge_size
        ok = (h > 0) & (w > 0)
        h, w = np.where(ok, h, 1), np.where(ok, w, 1)  # refused rows computed on 1x1, then zeroed
        ok &= np.maximum(h, w) / np.minimum(h, w) <= MAX_RATIO
        h_bar = np.rint(h / factor) * factor  # np.rint rounds half to even, as Python's round
        w_bar = np.rint(w / factor) * factor
        area = h * w
        big = h_bar * w_bar > self.max_pixels
        small = ~big & (h_bar * w_bar < self.min_pixels)
        down = np.sqrt(area / self.max_pixels)
        up = np.sqrt(self.min_pixels / area)
        h_bar = np.where(big, np.maximum(factor, np.floor(h / down / factor) * factor), h_bar)
        w_bar = np.where(big, np.maximum(factor, np.floor(w / down / factor) * factor), w_bar)
        h_bar = np.where(small, np.ceil(h * up / factor) * factor, h_bar)
        w_bar = np.where(small, np.ceil(w * up / factor) * factor, w_bar)
        grid = np.stack([np.ones_like(h), h_bar.astype(np.int64) // self.patch_size,
                         w_bar.astype(np.int64) // self.patch_size], axis=-1)
        return np.where(ok[..., None], grid, 0).astype(np.int32), ok

    def tokens(self, grid: np.ndarray) -> np.ndarray:
        """(N,) int32 image tokens per grid: `t * h * w // merge**2`, as the processor repeats
        its image token (a refused row's grid of 0 gives 0)."""
        cells = np.prod(np.asarray(grid, dtype=np.int64), axis=-1)
        return (cells // self.merge_size**2).astype(np.int32)


def _positive(value: Any, key: str) -> int:
    """`value` as a positive int, else an EtlError naming the key."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise EtlError(f"{key} must be a positive integer, got {value!r}")
    return value


def _pixels(config: Mapping[str, Any]) -> tuple[int, int]:
    """(min_pixels, max_pixels) as Qwen2VLImageProcessor reads them: top-level `min_pixels` /
    `max_pixels` over `size`'s `shortest_edge` / `longest_edge`; no `size` at all takes the class
    defaults, a `size` without them is refused at the first image, so here at once."""
    size = config.get("size")
    size = {"shortest_edge": _QWEN2_VL_DEFAULTS["shortest_edge"],
            "longest_edge": _QWEN2_VL_DEFAULTS["longest_edge"]} if size is None else size
    if not isinstance(size, Mapping):
        raise EtlError(f"size must be an object, got {size!r}")
    low, high = (config.get(key) if config.get(key) is not None else size.get(edge)
                 for key, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")))
    if low is None or high is None:
        raise EtlError("no min/max pixels (size has no shortest_edge/longest_edge, and there is "
                       "no min_pixels/max_pixels); transformers refuses such a processor: add "
                       "min_pixels and max_pixels")
    low, high = _positive(low, "min_pixels"), _positive(high, "max_pixels")
    if low > high:
        raise EtlError(f"min_pixels {low} is over max_pixels {high} (the config's values unless "
                       "overridden); give min_pixels <= max_pixels")
    return low, high


def qwen2_vl(config: Mapping[str, Any]) -> VisionRule:
    """The rule of Qwen2VLImageProcessor (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) from its config."""
    numbers = {key: _positive(config.get(key, _QWEN2_VL_DEFAULTS[key]), key)
               for key in ("patch_size", "merge_size", "temporal_patch_size")}
    low, high = _pixels(config)
    return VisionRule(processor=str(config.get("image_processor_type", "Qwen2VLImageProcessor")),
                      min_pixels=low, max_pixels=high, **numbers, **_QWEN_TOKENS)


# Image processor class -> builder from its preprocessor_config.json. transformers 5.23 names the
# torchvision backend `Qwen2VLImageProcessor` (`...Fast` is its deprecated alias) and the Pillow one
# `...Pil`; all three resize alike.
VISION: dict[str, Callable[[Mapping[str, Any]], VisionRule]] = {
    "Qwen2VLImageProcessor": qwen2_vl,
    "Qwen2VLImageProcessorFast": qwen2_vl,
    "Qwen2VLImageProcessorPil": qwen2_vl,
}


def has_vision(tokenizer: str) -> bool:
    """Whether a `--tokenizer` (a folder, or a tokenizer.json in one) comes with an image processor."""
    path = Path(tokenizer)
    return tokenizer != "bytes" and ((path if path.is_dir() else path.parent) / PREPROCESSOR_CONFIG).is_file()


def load_vision(folder: str | Path, *, min_pixels: int | None = None,
                max_pixels: int | None = None) -> VisionRule | None:
    """The `VisionRule` of a model folder's preprocessor_config.json; None when it has none (a
    text-only model). `min_pixels` / `max_pixels` replace the config's, as the processor's own
    keyword arguments do.

    Raises:
        EtlError: unreadable JSON, a processor class not in VISION, or pixel bounds that are not
            positive integers with min <= max.
    """
    path = Path(folder) / PREPROCESSOR_CONFIG
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EtlError(f"{path}: cannot read it as JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise EtlError(f"{path}: expected a JSON object, got {type(config).__name__}")
    kind = config.get("image_processor_type")
    if not isinstance(kind, str) or kind not in VISION:
        raise EtlError(f"{path}: image_processor_type {kind!r} is not one etl knows "
                       f"({', '.join(sorted(VISION))}); use a model whose processor is one of these")
    overrides = {"min_pixels": min_pixels, "max_pixels": max_pixels}
    config.update({key: value for key, value in overrides.items() if value is not None})
    try:
        return VISION[kind](config)
    except EtlError as exc:
        raise EtlError(f"{path}: {exc}") from exc
