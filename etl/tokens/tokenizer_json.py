"""Reading a tokenizer.json's `added_tokens` list without parsing the whole file.

`tokenizers` writes `added_tokens` right after `version`, `truncation` and `padding`: where the
file starts so, only that list is decoded: a `json.loads` of the whole file (Qwen2.5's is 7 MB)
held the GIL on the run's start-up path many times longer (docs/design.md, Measured costs).
"""

from __future__ import annotations

import json
from typing import Any

HEAD_CHARS = 4096  # the keys before `added_tokens` fit well within this


def added_tokens_span(text: str) -> tuple[int, int] | None:
    """Where the `added_tokens` list (`[` .. `]`) lies in a tokenizer.json's text, or None when the
    file does not start with the layout `tokenizers` writes (then parse it whole)."""
    key = text.find('"added_tokens"', 0, HEAD_CHARS)
    if key <= 0:
        return None
    try:
        before = json.loads(text[:key].rstrip().rstrip(",") + "}")
        start = text.index("[", key)
        _, end = json.JSONDecoder().raw_decode(text, start)
    except ValueError:
        return None
    if isinstance(before, dict) and set(before) <= {"version", "truncation", "padding"}:
        return start, end
    return None


def read_added_tokens(text: str) -> list[dict[str, Any]]:
    """The `added_tokens` entries of a tokenizer.json's text."""
    span = added_tokens_span(text)
    if span is not None:
        return json.loads(text[span[0] : span[1]])
    return json.loads(text).get("added_tokens", [])
