"""Loading a tokenizer: `bytes` or a Hugging Face tokenizer by path, or the one a finished run used."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from etl.errors import EtlError
from etl.tokens.hf_tokenizer import HFTokenizer
from etl.tokens.tokenizer import BYTES, ByteTokenizer, TextTokenizer


def load_tokenizer(
    spec: str | os.PathLike[str], *, special_tokens: Sequence[str] = (), lazy: bool = False
) -> TextTokenizer:
    """Load `bytes` (built-in; registers `special_tokens` from id 256) or a tokenizer path
    (`lazy`: its tokenizer.json parsed at the first question its answers do not hold, `HFTokenizer`).

    Special tokens are never added to a real tokenizer's vocabulary: templates check that theirs
    exist and fail with the missing name otherwise.
    """
    if str(spec) == BYTES:
        return ByteTokenizer(special_tokens)
    if not Path(spec).exists():
        raise EtlError(f"tokenizer {spec} does not exist; pass `bytes`, a tokenizer.json or a model directory")
    return HFTokenizer(spec, lazy=lazy)


def load_tokenizer_from_manifest(manifest: dict[str, Any]) -> TextTokenizer:
    """Rebuild the tokenizer a finished run used (for `etl inspect` and friends)."""
    info = manifest["tokenizer"]
    if info["name"] == BYTES:
        specials = sorted(manifest.get("special_ids", {}).items(), key=lambda kv: kv[1])
        return ByteTokenizer([tok for tok, _ in specials])
    return HFTokenizer(info["path"])
