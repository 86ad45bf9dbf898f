"""Cutting a long text where a tokenizer provably starts a new pre-token, so that its pieces
encode to exactly the ids of the whole text (`HFTokenizer.encode_texts` encodes the pieces)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

# A cut at byte p is safe when the tokenizer's pre-tokenizer starts a new piece at p in the whole
# text and scans text[:p] and text[p:] alone exactly as it scans them inside the whole (then the
# BPE model, which works per pre-token, gives the same ids). `cut_points` cuts only (A) after a
# single "\n" between two non-space characters, or (B) at a " " between two ASCII letters.
# Proved for these split regexes (none has a lookbehind; at (A) every alternative that can hold
# the "\n" ends with it, and the one chosen there is the same whether or not text follows; at (B)
# the letter run ends at the space and " word" starts there), and checked by
# tests/ingest/test_record_size.py against whole encodes with Qwen2.5 and trained GPT-2/Llama-3 models:
SAFE_SPLIT_PATTERNS = frozenset({
    # Qwen2 / Qwen2.5 / Qwen3
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    # Llama-3 (cl100k style)
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
})
# Every character Python's str.isspace() or the regex engine's \s (Unicode White_Space, older
# versions included) may call a space, as UTF-8: a neighbour of a cut must be none of them.
SPACE_CHARS = "\t\n\v\f\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u180e" + "".join(map(chr, range(0x2000, 0x200C))) + (
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)
_ASCII_SPACE = np.zeros(256, bool)
_ASCII_SPACE[[ord(ch) for ch in SPACE_CHARS if ord(ch) < 0x80]] = True
_WIDE_SPACES = [np.frombuffer(ch.encode("utf-8"), np.uint8) for ch in SPACE_CHARS if ord(ch) >= 0x80]
_ASCII_LETTER = np.zeros(256, bool)
_ASCII_LETTER[[*range(ord("A"), ord("Z") + 1), *range(ord("a"), ord("z") + 1)]] = True
CUT_SEARCH = 1 << 12  # bytes searched at a time for the next cut after a piece's target size


def cuttable(tok: Any) -> bool:
    """Whether `cut_points` cuts are safe for this `tokenizers.Tokenizer` (else: encode whole).

    Needs a normalizer that maps characters alone (none, NFC), a pre-tokenizer of
    `SAFE_SPLIT_PATTERNS` + byte-level (or GPT-2's byte-level regex), a deterministic BPE, no
    tokenizer-level truncation or padding, and added tokens that cannot span or swallow a cut
    (no space or newline in them, no lstrip/rstrip/single_word).
    """
    norm = json.loads(tok.normalizer.__getstate__()) if tok.normalizer is not None else None
    pre = json.loads(tok.pre_tokenizer.__getstate__()) if tok.pre_tokenizer is not None else None
    post = json.loads(tok.post_processor.__getstate__()) if tok.post_processor is not None else None
    norms = [] if norm is None else norm.get("normalizers", [norm]) if norm["type"] == "Sequence" else [norm]
    if any(n.get("type") != "NFC" for n in norms):
        return False
    if post is not None and post.get("type") != "ByteLevel":
        return False
    gpt2 = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
    split_then_bytes = [
        {"type": "Split", "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
    ]
    steps = (pre or {}).get("pretokenizers", [pre]) if (pre or {}).get("type") == "Sequence" else [pre]
    if steps == [None] or not (
        (len(steps) == 1 and gpt2.items() <= steps[0].items())
        or (
            len(steps) == 2
            and all(want.items() <= got.items() for want, got in zip(split_then_bytes, steps, strict=True))
            and steps[0].get("pattern", {}).get("Regex") in SAFE_SPLIT_PATTERNS
        )
    ):
        return False
    if type(tok.model).__name__ != "BPE" or getattr(tok.model, "dropout", None):
        return False
    if tok.truncation is not None or tok.padding is not None:
        return False
    return not any(
        a.lstrip or a.rstrip or a.single_word or " " in a.content or "\n" in a.content
        for a in tok.get_added_tokens_decoder().values()
    )


def _spaces_at(raw: np.ndarray, idx: np.ndarray, *, ending: bool, lo: int, hi: int) -> np.ndarray:
    """Whether the character starting (ending, when `ending`) at each byte index is a space."""
    out = _ASCII_SPACE[raw[idx]]
    for seq in _WIDE_SPACES:
        first = idx - len(seq) + 1 if ending else idx
        ok = (first >= lo) & (first + len(seq) <= hi)
        match = ok.copy()
        for k, byte in enumerate(seq):
            match[ok] &= raw[first[ok] + k] == byte
        out |= match
    return out


def _first_cut(raw: np.ndarray, lo: int, hi: int, *, start: int, stop: int) -> int | None:
    """The first safe cut p in [lo, hi), with start < p < stop (see SAFE_SPLIT_PATTERNS)."""
    p = np.arange(max(lo, start + 2), min(hi, stop - 1), dtype=np.int64)
    if not len(p):
        return None
    letters = (raw[p] == 0x20) & _ASCII_LETTER[raw[p - 1]] & _ASCII_LETTER[raw[p + 1]]
    newline = (raw[p - 1] == 0x0A) & ~_ASCII_SPACE[raw[p]] & ~_ASCII_SPACE[raw[p - 2]]
    if newline.any():  # the (rare) wide spaces are only looked for next to a newline
        at = p[newline]
        wide = _spaces_at(raw, at, ending=False, lo=start, hi=stop) | _spaces_at(
            raw, at - 2, ending=True, lo=start, hi=stop
        )
        newline[np.flatnonzero(newline)[wide]] = False
    hits = np.flatnonzero(letters | newline)
    return int(p[hits[0]]) if len(hits) else None


def cut_points(raw: np.ndarray, start: int, stop: int, piece: int) -> np.ndarray:
    """Byte offsets that cut the UTF-8 text raw[start:stop] into pieces of about `piece` bytes.

    A loop per piece (a 20 MB text has ~300), each a numpy scan of a few KiB: no per-token work.
    A stretch with no safe cut stays whole.
    """
    cuts: list[int] = []
    target = start + piece
    while target < stop - 1:
        found = _first_cut(raw, target, target + CUT_SEARCH, start=start, stop=stop)
        if found is None:
            target += CUT_SEARCH
            continue
        cuts.append(found)
        target = found + piece
    return np.asarray(cuts, dtype=np.int64)
