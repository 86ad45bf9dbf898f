"""A tiny vision-language processor folder written here (no download, no ../shared): a byte-level
BPE tokenizer with ChatML's and Qwen2-VL's vision special tokens, a chat template of our own
that renders an image part as Qwen2-VL's template does (`<|vision_start|><|image_pad|><|vision_end|>`),
and a Qwen2-VL image processor config with a small pixel budget (few image tokens per image)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from PIL import Image

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *VISION_TOKENS]
TEMPLATE = (
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for p in m['content'] %}{% if p['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# 28 x 28 pixels per merged patch: at most 64 image tokens an image.
MAX_PIXELS = 64 * 28 * 28
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


def make_vl_folder(folder: Path, *, max_pixels: int = MAX_PIXELS) -> Path:
    """Write the folder (tokenizer.json, tokenizer_config.json, preprocessor_config.json); returns it."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["Who are they? What is in the picture? A cat on a mat.\n" * 3, "the of and to in is " * 5]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIALS]))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "bos_token": None, "add_bos_token": False, "chat_template": TEMPLATE}))
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 3136, "max_pixels": max_pixels,
        "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2, "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD, "do_resize": True, "do_rescale": True, "do_normalize": True,
        "do_convert_rgb": True, "rescale_factor": 1 / 255, "resample": 3}))
    return folder


def image_bytes(size: tuple[int, int], mode: str = "RGB", fmt: str = "PNG", *, orientation: int | None = None,
                frames: int = 1) -> bytes:
    """An image file's bytes: `size` (w, h) in `mode`, a gradient so resizing has something to do."""
    w, h = size
    base = Image.linear_gradient("L").resize((w, h)).convert(mode)
    out = io.BytesIO()
    if frames > 1:
        base.save(out, fmt, save_all=True, append_images=[base.rotate(90 * i) for i in range(1, frames)])
    elif orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        base.save(out, fmt, exif=exif)
    else:
        base.save(out, fmt)
    return out.getvalue()
