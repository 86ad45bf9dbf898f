"""Image data for the loader and training tests, made here (no download, no ../shared): a tiny
vision-language processor folder (a byte-level BPE with ChatML's and Qwen2-VL's vision special
tokens, a chat template, a Qwen2-VL image processor config with a small pixel budget), images of
random pixels in several modes and sizes, LLaMA-Factory-style records and their `etl run`."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

from etl.cli import main
from tests.images import vl_folder

# 28 x 28 pixels a merged patch: 4 to 16 image tokens an image, so a tiny model trains in seconds.
MAX_PIXELS = 16 * 28 * 28
# (width, height, mode) of the images the records use: grids 1x2 .. 4x4 merged patches.
SIZES = [(60, 40, "RGB"), (100, 90, "L"), (33, 57, "RGBA"), (120, 64, "P"), (80, 80, "RGB"), (45, 130, "RGB")]


def make_vl_folder(folder: Path, *, max_pixels: int = MAX_PIXELS) -> Path:
    """The tiny processor folder of `tests.images.vl_folder` with this module's pixel budget."""
    return vl_folder.make_vl_folder(folder, max_pixels=max_pixels)


def image_bytes(width: int, height: int, mode: str = "RGB", *, seed: int = 0, fmt: str = "PNG") -> bytes:
    """An image file of random pixels (resampling has something to do), `P` with a transparent index."""
    rng = np.random.default_rng(seed)
    rgba = Image.fromarray(rng.integers(0, 256, (height, width, 4), dtype=np.uint8), "RGBA")
    out = io.BytesIO()
    if mode == "P":
        rgba.convert("RGB").quantize(16).save(out, fmt, transparency=3)
    else:
        rgba.convert(mode).save(out, fmt)
    return out.getvalue()


def write_images(folder: Path) -> list[Path]:
    """The SIZES images as PNG files in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, (w, h, mode) in enumerate(SIZES):
        paths.append(folder / f"img{k}.png")
        paths[-1].write_bytes(image_bytes(w, h, mode, seed=k))
    return paths


def records(n: int) -> list[dict]:
    """n chats: every third text-only, the others with one or two `<image>` placeholders."""
    out = []
    for i in range(n):
        images = [] if i % 3 == 2 else [f"images/img{(i + j) % len(SIZES)}.png" for j in range(1 + i % 2)]
        user = "<image>" * len(images) + f"What is in the picture {i}?" + " the" * (i % 4)
        out.append({"messages": [{"role": "user", "content": user},
                                 {"role": "assistant", "content": "A cat on a mat." + " and" * (i % 5)}],
                    "images": images})
    return out


def run_vl(root: Path, n: int = 12, *flags: str) -> Path:
    """`etl run` of `records(n)` with the tiny folder (``root``/vl); returns DST (``root``/dst)."""
    folder = make_vl_folder(root / "vl")
    write_images(root / "images")
    src = root / "chats.json"
    src.write_text(json.dumps(records(n)))
    dst = root / "dst"
    assert main(["run", str(src), str(dst), "--tokenizer", str(folder), "--quiet", *flags]) == 0
    return dst
