"""The tokenizer interface (`TextTokenizer`), the built-in byte-level `bytes` tokenizer, and the
encoding of template strings.

`encode_texts` is the only per-text work of the pipeline: it takes an Arrow string array and
returns an Arrow `large_list<int32>` array, so callers never touch Python lists of ids.
Message content is always encoded as text: special-token strings inside it never become
special ids (security). Only `encode_template_text` maps special-token strings to their ids.
Hugging Face tokenizers are in `hf_tokenizer` (long texts cut by `cutting`); `loading` picks one.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import pyarrow as pa

from etl.arrow_values import from_numpy, string_offsets
from etl.errors import EtlError

BYTES = "bytes"
# `encode_texts(timings=...)` key: seconds spent turning the tokenizer's Encodings into numpy ids
# (part of the pipeline's `tokenizer` time; the rest is the tokenizer's own batched call).
IDS_TIMING = "tokenizer_ids"


class TextTokenizer(Protocol):
    """What the pipeline needs from a tokenizer."""

    name: str
    path: str | None
    sha256: str | None
    # What a text's ids depend on besides the text; None: not worth caching (etl.cache).
    cache_key: str | None

    @property
    def vocab_size(self) -> int: ...

    def encode_texts(self, texts: pa.Array, *, timings: Counter[str] | None = None) -> pa.LargeListArray: ...

    def special_id(self, token: str) -> int | None: ...

    def encode_fixed(self, text: str) -> list[int]:
        """Ids of a text the run's settings fix (a template piece, the default system prompt)."""
        ...

    def token_strings(self, ids: Sequence[int]) -> list[str]: ...


def offsets_to_list_array(flat: np.ndarray, offsets: np.ndarray) -> pa.LargeListArray:
    """The `encode_texts` result: flat int32 ids cut at int64 offsets (len(texts) + 1 of them)."""
    return pa.LargeListArray.from_arrays(from_numpy(offsets.astype(np.int64, copy=False)),
                                         from_numpy(flat.astype(np.int32, copy=False)))


def as_large_string(texts: pa.Array | pa.ChunkedArray) -> pa.LargeStringArray:
    """`encode_texts`'s input as one large_string array, whose buffers the tokenizers read."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks() if texts.num_chunks != 1 else texts.chunk(0)
    if texts.null_count:
        raise ValueError("encode_texts got null strings; the pipeline must fill them first")
    return texts.cast(pa.large_string())


class ByteTokenizer:
    """Byte-level tokenizer: ids 0..255 are UTF-8 bytes, special tokens follow from 256.

    Encoding is a zero-copy view of the Arrow string buffers (no per-text work at all), which
    makes it the fastest possible tokenizer for tests and for measuring the pipeline itself.
    """

    name = BYTES
    path = None
    sha256 = None
    cache_key = None  # a view of the text's bytes: nothing a cache could save (etl.cache)

    def __init__(self, special_tokens: Sequence[str] = ()) -> None:
        unique = list(dict.fromkeys(special_tokens))
        self._special = {tok: 256 + i for i, tok in enumerate(unique)}
        self._by_id = {i: tok for tok, i in self._special.items()}

    @property
    def vocab_size(self) -> int:
        return 256 + len(self._special)

    def encode_texts(self, texts: pa.Array, *, timings: Counter[str] | None = None) -> pa.LargeListArray:
        """Ids of every text: a view of its UTF-8 bytes (nothing to time apart, so `timings` is unused)."""
        arr = as_large_string(texts)
        offsets = string_offsets(arr)
        data = arr.buffers()[2]
        raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
        flat = raw[offsets[0] : offsets[-1]].astype(np.int32)
        return offsets_to_list_array(flat, offsets - offsets[0])

    def encode(self, text: str) -> list[int]:
        """Encode one string as text (the interface `etl.sft` expects)."""
        return list(text.encode("utf-8"))

    def encode_fixed(self, text: str) -> list[int]:
        return self.encode(text)

    def special_id(self, token: str) -> int | None:
        return self._special.get(token)

    def token_to_id(self, token: str) -> int | None:
        """Alias of `special_id`, named like `tokenizers.Tokenizer.token_to_id`."""
        return self._special.get(token)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        return [
            self._by_id[i] if i in self._by_id else bytes([i]).decode("latin-1") if i < 256 else f"<{i}>"
            for i in ids
        ]


def split_on_specials(text: str, specials: Sequence[str]) -> list[tuple[str, bool]]:
    """Split a template string into (piece, is_special) parts, longest special first."""
    if not specials:
        return [(text, False)] if text else []
    pattern = "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True))
    parts: list[tuple[str, bool]] = []
    pos = 0
    for m in re.finditer(pattern, text):
        if m.start() > pos:
            parts.append((text[pos : m.start()], False))
        parts.append((m.group(0), True))
        pos = m.end()
    if pos < len(text):
        parts.append((text[pos:], False))
    return parts


def encode_template_text(tokenizer: TextTokenizer, text: str, specials: Sequence[str]) -> list[int]:
    """Encode a template string: its special tokens become their ids, the rest is text.

    Raises:
        EtlError: a special token of the template is not in the tokenizer's vocabulary.
    """
    ids: list[int] = []
    parts = split_on_specials(text, specials)
    strip = getattr(tokenizer, "special_strip", lambda _tok: (False, False))
    # An added token with rstrip/lstrip (Phi-3's markers) swallows the whitespace next to it
    # when a whole text is tokenized; strip it here too so per-turn ids match that.
    for i, (piece, is_special) in enumerate(parts):
        if is_special:
            continue
        if i > 0 and strip(parts[i - 1][0])[1]:
            piece = piece.lstrip()
        if i + 1 < len(parts) and strip(parts[i + 1][0])[0]:
            piece = piece.rstrip()
        parts[i] = (piece, False)
    for piece, is_special in parts:
        if is_special:
            tid = tokenizer.special_id(piece)
            if tid is None:
                raise EtlError(
                    f"template token {piece!r} is not in the vocabulary of tokenizer {tokenizer.name}; "
                    "pick a template this tokenizer was trained with (e.g. --template chatml for Qwen, "
                    "phi3 for Phi-3) or use --tokenizer bytes"
                )
            ids.append(tid)
        elif piece:
            ids.extend(tokenizer.encode_fixed(piece))
    return ids
