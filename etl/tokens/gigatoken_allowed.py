"""Which tokenizer.json files gigatoken may encode: those whose normalizer, pre-tokenizer, model
and decoder options are on `ALLOWED`, a list of configurations proven to give `tokenizers`' ids.

gigatoken 0.10 loads some options and reads them otherwise than `tokenizers` (NOTES.md,
2026-11-28): with Qwen2.5's vocabulary, ByteLevel `add_prefix_space: true` changed the ids of
4,493 of 4,779 mixed texts, `use_regex: true` after the Split 2,108, Split `behavior: "Removed"`
4,605, BPE `dropout` 3,580. A per-run sample of texts cannot prove a configuration (the sample
may miss what differs), so gigatoken gets only files whose every option is listed here, each
entry kept with its proof: tests/tokens/test_gigatoken_allowed.py (hypothesis texts over random
unicode, whitespace, digits and punctuation, and real texts of ../shared/data where present).
Anything else is encoded by `tokenizers` (`auto`) or refused (`--tokenizer-backend gigatoken`).

Only what decides ids is read: the vocabulary and merges are gigatoken's to refuse (a byte-level
vocabulary without every byte, byte fallback without byte tokens); `post_processor` adds tokens
only with `add_special_tokens`, which content encoding never sets; added tokens are removed
before gigatoken sees the file (`gigatoken_encoder.without_added_tokens`).
"""

from __future__ import annotations

import json
from typing import Any

from etl.tokens.cutting import SAFE_SPLIT_PATTERNS

# Bumped whenever ALLOWED changes: part of the token cache's key for gigatoken's ids
# (`backend.ContentBackend.encoder`), so ids of an entry since removed are not served again.
ALLOWED_VERSION = 1
ABSENT = object()  # the key may be missing (the two libraries then agree on its default)
ANY_BOOL, ANY_STR = (False, True), (str,)  # `str`: any string

QWEN2, LLAMA3 = sorted(SAFE_SPLIT_PATTERNS, key=lambda p: "{1,3}" in p)  # Qwen2/2.5/3, then Llama-3 (cl100k)


def _byte_level(*, use_regex: bool) -> dict[str, tuple[Any, ...]]:
    # trim_offsets moves offsets only; add_prefix_space: true is read differently (module doc)
    return {"type": ("ByteLevel",), "add_prefix_space": (False,), "trim_offsets": ANY_BOOL,
            "use_regex": (use_regex,)}


def _split(pattern: str) -> dict[str, tuple[Any, ...]]:
    return {"type": ("Split",), "pattern": ({"Regex": pattern},), "behavior": ("Isolated",), "invert": (False,)}


_BYTE_LEVEL_BPE = {
    "type": ("BPE",), "dropout": (None,), "unk_token": (None,), "continuing_subword_prefix": (None, ""),
    "end_of_word_suffix": (None, ""), "fuse_unk": (False,), "byte_fallback": (False,),
    "ignore_merges": (False, True, ABSENT),
}
_BYTE_LEVEL_DECODER = {"type": ("ByteLevel",), "add_prefix_space": ANY_BOOL, "trim_offsets": ANY_BOOL,
                       "use_regex": ANY_BOOL}
_SPACE = "\u2581"  # SentencePiece's ▁

# name -> component -> the configurations accepted for it: a dict of key -> allowed values (every
# key of the component must be listed; a list: a Sequence's steps, in order; None: no component).
ALLOWED: dict[str, dict[str, list[Any]]] = {
    "qwen2": {  # Qwen2 / Qwen2.5 / Qwen3
        "normalizer": [{"type": ("NFC",)}, None],
        "pre_tokenizer": [[_split(QWEN2), _byte_level(use_regex=False)]],
        "model": [_BYTE_LEVEL_BPE],
        "decoder": [_BYTE_LEVEL_DECODER],
    },
    "llama3": {  # Llama-3's cl100k-style split (digits in threes)
        "normalizer": [None],
        "pre_tokenizer": [[_split(LLAMA3), _byte_level(use_regex=False)]],
        "model": [_BYTE_LEVEL_BPE],
        "decoder": [_BYTE_LEVEL_DECODER],
    },
    "gpt2": {  # GPT-2's byte-level regex inside ByteLevel
        "normalizer": [None],
        "pre_tokenizer": [_byte_level(use_regex=True)],
        "model": [_BYTE_LEVEL_BPE],
        "decoder": [_BYTE_LEVEL_DECODER],
    },
    "sentencepiece_bpe": {  # Phi-3, Llama-2: ▁ for spaces, byte fallback
        "normalizer": [[{"type": ("Prepend",), "prepend": (_SPACE,)},
                        {"type": ("Replace",), "pattern": ({"String": " "},), "content": (_SPACE,)}]],
        "pre_tokenizer": [None],
        "model": [{"type": ("BPE",), "dropout": (None,), "unk_token": (None, *ANY_STR),
                   "continuing_subword_prefix": (None, ""), "end_of_word_suffix": (None, ""),
                   "fuse_unk": ANY_BOOL, "byte_fallback": (True,), "ignore_merges": (False, ABSENT)}],
        "decoder": [[{"type": ("Replace",), "pattern": ({"String": _SPACE},), "content": (" ",)},
                     {"type": ("ByteFallback",)}, {"type": ("Fuse",)},
                     {"type": ("Strip",), "content": (" ",), "start": (1,), "stop": (0,)}]],
    },
}
COMPONENTS = ("model", "pre_tokenizer", "normalizer", "decoder")  # in the order a refusal names them
_STEPS = {"normalizer": "normalizers", "pre_tokenizer": "pretokenizers", "decoder": "decoders"}


def components(raw: bytes) -> dict[str, Any]:
    """The options that decide ids, from tokenizer.json `raw`: its normalizer, pre-tokenizer and
    decoder, its model without vocabulary and merges, truncation and padding. A whole parse, on
    the thread that loads gigatoken (the times: docs/design.md, Measured costs)."""
    spec = json.loads(raw)
    model = {k: v for k, v in (spec.get("model") or {}).items() if k not in ("vocab", "merges")}
    return {**{k: spec.get(k) for k in ("normalizer", "pre_tokenizer", "decoder", "truncation", "padding")},
            "model": model}


def _matches(got: Any, rule: dict[str, tuple[Any, ...]]) -> bool:
    if not isinstance(got, dict) or not set(got) <= set(rule):
        return False
    for key, allowed in rule.items():
        value = got.get(key, ABSENT)
        if not any(value is a or (a is str and isinstance(value, str)) or (a is not ABSENT and value == a
                                                                            and type(value) is type(a))
                   for a in allowed):
            return False
    return True


def _steps(name: str, got: Any) -> Any:
    """A Sequence component's steps (a list); any other component as it is."""
    key = _STEPS.get(name)
    if key and isinstance(got, dict) and got.get("type") == "Sequence" and set(got) == {"type", key}:
        return got[key]
    return got


def _mismatch(name: str, got: Any, rules: list[Any]) -> str | None:
    """None where one of `rules` accepts component `got`, else what no rule accepts (of a
    Sequence: its first step that the rule of its length refuses)."""
    steps, shown = _steps(name, got), f"{name} {_show(got)}"
    for rule in rules:
        if (rule is None and got is None) or (isinstance(rule, dict) and _matches(got, rule)):
            return None
        if isinstance(rule, list) and isinstance(steps, list) and len(rule) == len(steps):
            bad = [i for i, (g, r) in enumerate(zip(steps, rule, strict=True)) if not _matches(g, r)]
            if not bad:
                return None
            shown = f"{name} step {bad[0] + 1} {_show(steps[bad[0]])}"
    return shown


def refusal(spec: dict[str, Any]) -> str | None:
    """Why gigatoken may not encode a tokenizer with these `components` (None: an `ALLOWED` entry
    accepts every one), in a few words for the manifest and the error."""
    for key in ("truncation", "padding"):
        if spec.get(key) is not None:
            return f"its tokenizer.json sets {key} (tokenizers applies it)"
    best: tuple[int, str] = (-1, "")
    for rules in ALLOWED.values():
        failed = [m for name in COMPONENTS if (m := _mismatch(name, spec.get(name), rules[name])) is not None]
        if not failed:
            return None
        best = max(best, (len(COMPONENTS) - len(failed), failed[0]), key=lambda b: b[0])
    return f"its {best[1]} is not on the list of configurations proven to give tokenizers' ids"


def _show(got: Any) -> str:
    text = json.dumps(got, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 160 else text[:157] + "..."
