"""gigatoken (PyPI `gigatoken`, a Rust BPE encoder of byte-level and SentencePiece-BPE
tokenizer.json files) as the content encoder of a Hugging Face tokenizer: the same ids as
`tokenizers`, in a small fraction of its time (docs/tokenizers.md).

Content is text (`HFTokenizer._tok`: every added token special, `encode_special_tokens`), and
gigatoken always matches added tokens' strings to their ids. So gigatoken gets the tokenizer.json
without its added tokens: their strings are then plain text to its BPE as to `tokenizers`'
(T0's 20k `<|endoftext|>`-ending completions: equal ids for Qwen2.5, Qwen3 and Phi-3). The ids
leave it as flat values + offsets (an awkward array's buffers), never as Python lists.

The two libraries read Unicode at different versions (gigatoken 0.10: 17, tokenizers 0.23's
regex engine: older), so a character added lately is a letter to one and not to the other:
U+323B0 before "/A" splits differently. Texts with a code point that Unicode 14 leaves unassigned
(`needs_reference`, vectorized over the bytes) therefore go to `tokenizers` (`route`).
`etl.tokens.backend.ContentBackend` still checks each run: some of the run's first texts go
through both (`first_difference`), and any difference sends the run back to `tokenizers`.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

from etl.arrow_values import string_offsets
from etl.errors import EtlError
from etl.tokens.tokenizer_json import added_tokens_span
from etl.tokens.unicode_unassigned import UNASSIGNED

HF, GIGATOKEN, AUTO = "hf", "gigatoken", "auto"
# Text bytes per gigatoken call: its output is ~4 B per token (uint32 + offsets), so 16 MiB of text
# stays under ~20 MB of ids; the call itself spreads over every core.
FAST_BYTES = 16 << 20


def load(raw: bytes, name: str) -> Any:
    """A gigatoken tokenizer of tokenizer.json `raw` without its added tokens (see the module).

    Raises:
        EtlError: gigatoken is not installed, or cannot read this tokenizer (a WordPiece or
            Unigram model, say); the message says how to go on with `tokenizers`.
    """
    try:
        # gigatoken and the awkward arrays it returns (docs/design.md, Measured costs): only for a
        # run that encodes with it, here, on `HFTokenizer.preload`'s thread
        import awkward  # noqa: F401
        import gigatoken
    except ImportError as exc:
        raise EtlError("tokenizer backend gigatoken is not installed (`pip install gigatoken`); "
                       "pass --tokenizer-backend hf or auto") from exc
    try:
        return gigatoken.Tokenizer.from_json(without_added_tokens(raw))
    except Exception as exc:  # gigatoken raises plain Exceptions for models it does not support
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__  # its first line
        raise EtlError(f"tokenizer backend gigatoken cannot read tokenizer {name} ({why}); "
                       "pass --tokenizer-backend hf or auto") from exc


def without_added_tokens(raw: bytes) -> str:
    """tokenizer.json `raw` with an empty `added_tokens` list: only that list is found
    (`tokenizer_json.added_tokens_span`; a whole parse and dump of Qwen2.5's 7 MB held the run's
    GIL: docs/design.md, Measured costs); any other layout is parsed whole."""
    text = raw.decode("utf-8")
    span = added_tokens_span(text)
    if span is not None:
        return text[: span[0]] + "[]" + text[span[1] :]
    spec = json.loads(text)
    spec["added_tokens"] = []
    return json.dumps(spec)


def _as_awkward(texts: pa.LargeStringArray) -> Any:
    """The strings as an awkward array over the same buffers (no copy): gigatoken's fastest input,
    faster than a list of Python strings (docs/design.md, Measured costs)."""
    # awkward: a dependency of gigatoken, imported with it
    import awkward as ak

    offsets = string_offsets(texts)
    data = texts.buffers()[2]
    chars = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
    content = ak.contents.NumpyArray(chars, parameters={"__array__": "char"})
    return ak.Array(ak.contents.ListOffsetArray(ak.index.Index64(offsets), content,
                                                parameters={"__array__": "string"}))


def encode(tok: Any, texts: pa.LargeStringArray) -> tuple[np.ndarray, np.ndarray]:
    """(flat int32 ids, ids per text) of the texts, in calls of about FAST_BYTES of text."""
    offsets = string_offsets(texts)
    flats, lengths = [np.zeros(0, np.int32)], [np.zeros(0, np.int64)]
    start = 0
    while start < len(texts):
        by_bytes = int(np.searchsorted(offsets, offsets[start] + FAST_BYTES, side="right")) - 1
        stop = max(start + 1, min(by_bytes, len(texts)))
        out = _buffers(tok.encode_batch(_as_awkward(texts.slice(start, stop - start))))
        flats.append(out[0])
        lengths.append(out[1])
        start = stop
    return np.concatenate(flats), np.concatenate(lengths)


def _buffers(ids: Any) -> tuple[np.ndarray, np.ndarray]:
    """(flat int32 values, lengths) of gigatoken's awkward list<uint32> result."""
    # awkward: a dependency of gigatoken, imported with it
    import awkward as ak

    layout = ak.to_layout(ids)
    offsets = np.asarray(layout.offsets.data)
    values = np.asarray(layout.content.data)[offsets[0] : offsets[-1]]
    return values.astype(np.int32), np.diff(offsets)  # ids < 2**31: every vocabulary fits int32


def sample(n: int, k: int) -> np.ndarray:
    """Up to `k` of `n` indices spread evenly over them, always the first and last: the same for
    the same chunk, so a rerun checks the same texts."""
    if n <= k:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, k).round().astype(np.int64))


def first_difference(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int | None:
    """The first text whose ids differ between two (flat ids, lengths) encodings, or None.

    Up to the first text whose lengths differ the offsets agree, so one comparison of the flat
    ids over that span finds any earlier difference.
    """
    (flat_a, len_a), (flat_b, len_b) = a, b
    unequal = np.flatnonzero(len_a != len_b)
    first = int(unequal[0]) if len(unequal) else None
    span = len(len_a) if first is None else first
    ends = np.cumsum(len_a[:span])
    upto = int(ends[-1]) if span else 0
    token = np.flatnonzero(flat_a[:upto] != flat_b[:upto])
    if len(token):
        return int(np.searchsorted(ends, token[0], side="right"))
    return first


def _unassigned() -> tuple[np.ndarray, np.ndarray]:
    """(first, last) code point of each range of `UNASSIGNED`, sorted."""
    pairs = np.array([int(x, 16) for x in UNASSIGNED.replace("-", " ").split()], dtype=np.int64)
    return pairs[0::2], pairs[1::2]


_FIRST, _LAST = _unassigned()


def needs_reference(texts: pa.LargeStringArray) -> np.ndarray:
    """Indices of the texts that hold a code point Unicode 14 leaves unassigned (see the module).

    Decodes only the lead bytes of multi-byte characters (ASCII text costs one comparison a
    byte; docs/design.md, Measured costs).
    """
    offsets = string_offsets(texts)
    data = texts.buffers()[2]
    if data is None or len(texts) == 0:
        return np.zeros(0, np.int64)
    raw = np.frombuffer(data, dtype=np.uint8)[: offsets[-1]]
    lead = offsets[0] + np.flatnonzero(raw[offsets[0] :] >= 0xC0)  # 0x80-0xBF: continuation bytes
    if not len(lead):
        return np.zeros(0, np.int64)
    b = [raw[np.minimum(lead + k, len(raw) - 1)].astype(np.int64) & 0x3F for k in (1, 2, 3)]
    b0 = raw[lead].astype(np.int64)
    cp = np.where(b0 < 0xE0, (b0 & 0x1F) << 6 | b[0],
                  np.where(b0 < 0xF0, (b0 & 0x0F) << 12 | b[0] << 6 | b[1],
                           (b0 & 0x07) << 18 | b[0] << 12 | b[1] << 6 | b[2]))
    at = np.searchsorted(_FIRST, cp, side="right") - 1
    odd = (at >= 0) & (cp <= _LAST[np.maximum(at, 0)])
    return np.unique(np.searchsorted(offsets, lead[odd], side="right") - 1)


def merge(n: int, parts: list[tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]]) -> tuple[np.ndarray, np.ndarray]:
    """(flat ids, lengths) of `n` texts from encodings of disjoint subsets (indices, (flat, lengths)),
    each subset's flat ids copied to its texts' places in one scatter."""
    lengths = np.zeros(n, np.int64)
    for index, (_, length) in parts:
        lengths[index] = length
    ends = np.cumsum(lengths)
    flat = np.zeros(int(ends[-1]) if n else 0, np.int32)
    for index, (ids, length) in parts:
        starts = ends[index] - length
        shift = np.repeat(starts - (np.cumsum(length) - length), length)
        flat[np.arange(len(ids)) + shift] = ids
    return flat, lengths
