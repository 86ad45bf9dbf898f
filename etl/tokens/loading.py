"""Loading a tokenizer: `bytes` or a Hugging Face tokenizer by path, or the one a finished run used."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from etl.errors import EtlError
from etl.tokens.chat_jinja import CONFIG_FILE, chat_template_source, load_config
from etl.tokens.hf_tokenizer import HFTokenizer
from etl.tokens.tokenizer import BYTES, ByteTokenizer, TextTokenizer


def load_tokenizer(
    spec: str | os.PathLike[str], *, special_tokens: Sequence[str] = (), lazy: bool = False,
    backend: str = "auto",
) -> TextTokenizer:
    """Load `bytes` (built-in; registers `special_tokens` from id 256) or a tokenizer path
    (`lazy`: its tokenizer.json parsed at the first question its answers do not hold; `backend`:
    what encodes its content, `HFTokenizer`).

    Special tokens are never added to a real tokenizer's vocabulary: templates check that theirs
    exist and fail with the missing name otherwise.
    """
    if str(spec) == BYTES:
        return ByteTokenizer(special_tokens)
    if not Path(spec).exists():
        raise EtlError(f"tokenizer {spec} does not exist; pass `bytes`, a tokenizer.json or a model directory")
    return HFTokenizer(spec, lazy=lazy, backend=backend)


def has_chat_template(spec: str | os.PathLike[str] | None) -> bool:
    """Whether a tokenizer's tokenizer_config.json (in its directory, or beside its tokenizer.json)
    defines a chat_template: read without parsing tokenizer.json (~7 KB for Qwen), so `etl run`
    can choose the `auto` template before the tokenizer loads. False for `bytes`."""
    if spec is None or str(spec) == BYTES:
        return False
    path = Path(spec)
    config = path / CONFIG_FILE if path.is_dir() else path.with_name(CONFIG_FILE)
    if not config.is_file():
        return False
    document = load_config(config)  # a malformed file is an error naming it, not "no template"
    try:
        chat_template_source(document)
    except EtlError:  # no chat_template, or an empty one
        return False
    return True


def load_tokenizer_from_manifest(manifest: dict[str, Any]) -> TextTokenizer:
    """Rebuild the tokenizer a finished run used (for `etl inspect` and friends)."""
    info = manifest["tokenizer"]
    if info["name"] == BYTES:
        specials = sorted(manifest.get("special_ids", {}).items(), key=lambda kv: kv[1])
        return ByteTokenizer([tok for tok, _ in specials])
    return HFTokenizer(info["path"])
