"""Tokenizers behind one batched interface: the built-in byte-level `bytes` and HF `tokenizers`.

`encode_texts` is the only per-text work of the pipeline: it takes an Arrow string array and
returns an Arrow `large_list<int32>` array, so callers never touch Python lists of ids.
Message content is always encoded as text: special-token strings inside it never become
special ids (DESIGN §3). Only `encode_template_text` maps special-token strings to their ids.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import operator
import os
import re
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from etl.errors import EtlError

BYTES = "bytes"
# Strings per encode_batch call: NOTES.md measured that chunks of ~1k strings keep the
# Rust thread pool busy without the slow-down one huge batch shows.
ENCODE_CHUNK = 1024
# Text bytes per encode_batch call too: the Encoding objects of a call hold ~260 B per token
# (ids, type ids, token strings, offsets, masks) until their ids are copied out, so a call is
# bounded by size as well as by count: ~80 MB for 1 MiB of Qwen2.5 text (4 MiB added ~0.1 GB
# to the peak of bench/big_record.py). Chat turns are ~1 KiB: 1,024 of them still fit.
ENCODE_BYTES = 1 << 20
# A text longer than this is encoded in pieces of about this size (`cut_points`):
# one encode of a 20 MB message peaked at 2.5 GB (bench/big_record.py) and ran on one thread.
PIECE_BYTES = 1 << 16
# `encode_texts(timings=...)` key: seconds spent turning the tokenizer's Encodings into numpy ids
# (part of the pipeline's `tokenizer` time; the rest is the tokenizer's own batched call).
IDS_TIMING = "tokenizer_ids"


class TextTokenizer(Protocol):
    """What the pipeline needs from a tokenizer."""

    name: str
    path: str | None
    sha256: str | None

    @property
    def vocab_size(self) -> int: ...

    def encode_texts(self, texts: pa.Array, *, timings: Counter[str] | None = None) -> pa.LargeListArray: ...

    def special_id(self, token: str) -> int | None: ...

    def token_strings(self, ids: Sequence[int]) -> list[str]: ...


def _offsets_to_list_array(flat: np.ndarray, offsets: np.ndarray) -> pa.LargeListArray:
    return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(flat, pa.int32()))


def _as_large_string(texts: pa.Array | pa.ChunkedArray) -> pa.LargeStringArray:
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

    def __init__(self, special_tokens: Sequence[str] = ()) -> None:
        unique = list(dict.fromkeys(special_tokens))
        self._special = {tok: 256 + i for i, tok in enumerate(unique)}
        self._by_id = {i: tok for tok, i in self._special.items()}

    @property
    def vocab_size(self) -> int:
        return 256 + len(self._special)

    def encode_texts(self, texts: pa.Array, *, timings: Counter[str] | None = None) -> pa.LargeListArray:
        """Ids of every text: a view of its UTF-8 bytes (nothing to time apart, so `timings` is unused)."""
        arr = _as_large_string(texts)
        offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
        data = arr.buffers()[2]
        raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
        flat = raw[offsets[0] : offsets[-1]].astype(np.int32)
        return _offsets_to_list_array(flat, offsets - offsets[0])

    def encode(self, text: str) -> list[int]:
        """Encode one string as text (the interface `etl.sft` expects)."""
        return list(text.encode("utf-8"))

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


_IDS = operator.attrgetter("ids")


def flatten_ids(batch: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(flat int32 ids, ids per encoding) of a batch of `tokenizers.Encoding`s.

    `Encoding.ids` builds a Python list of Python ints (~40 ns a token, most of this step;
    tokenizers has no buffer or numpy output), so the copy is at best one C-level pass over
    those ints. Making each list only when `np.fromiter` reaches it, and dropping it right
    after, keeps the ints in cache and holds one list at a time instead of ~40 B per token of
    the whole batch: 20-30% less CPU than building every list first (bench/hot_path.py, T0's
    13.7M Qwen2.5 tokens: 1.40 s -> 0.94 s). Building the lists first and converting them with
    `pa.array(..., pa.large_list(pa.int32()))`, `np.concatenate` of per-list arrays or
    `Encoding.merge` measured 15-60% slower than that.
    """
    lengths = np.fromiter(map(len, batch), dtype=np.int64, count=len(batch))
    ids = itertools.chain.from_iterable(map(_IDS, batch))
    return np.fromiter(ids, dtype=np.int32, count=int(lengths.sum())), lengths


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer from `tokenizer.json` or a model directory."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        from tokenizers import Tokenizer

        p = Path(path)
        file = p / "tokenizer.json" if p.is_dir() else p
        if not file.is_file():
            raise EtlError(
                f"tokenizer {path}: no tokenizer.json found; pass a tokenizer.json file, a Hugging "
                "Face model directory that contains one, or `bytes`"
            )
        # Absolute, so the manifest's path loads from any folder (`etl inspect` run elsewhere).
        self.path = str(file.resolve())
        self.name = str(path)
        raw = file.read_bytes()
        self.sha256 = hashlib.sha256(raw).hexdigest()
        try:
            self._tok = Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as exc:  # tokenizers raises a bare Exception for any bad file
            raise EtlError(
                f"tokenizer {path}: {file.name} is not a Hugging Face tokenizers file ({exc}); "
                "pass a tokenizer.json or the model directory that holds one"
            ) from exc
        # Content is data, never control: special-token strings in content encode as text.
        self._tok.encode_special_tokens = True
        config = file.with_name("tokenizer_config.json")
        self.config: dict[str, Any] = json.loads(config.read_text("utf-8")) if config.is_file() else {}

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode_texts(self, texts: pa.Array, *, timings: Counter[str] | None = None) -> pa.LargeListArray:
        """Ids of every text, as if each were encoded whole.

        Texts over `PIECE_BYTES` are cut where this tokenizer provably starts a new pre-token
        (`cut_points`; tokenizers it cannot prove it for encode them whole), and pieces are
        encoded a bounded number of bytes at a time, their ids copied to numpy per call: memory
        follows `ENCODE_BYTES`, not the longest text, and a long text's pieces use every thread.

        Args:
            texts: strings without nulls.
            timings: when given, receives the seconds of the ids copy under `IDS_TIMING`.
        """
        arr = _as_large_string(texts)
        bounds = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
        data = arr.buffers()[2]
        raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
        cuts = [np.zeros(0, np.int64)]
        if self.cuttable:
            long = np.flatnonzero(np.diff(bounds) > PIECE_BYTES)
            cuts += [cut_points(raw, int(bounds[i]), int(bounds[i + 1]), PIECE_BYTES) for i in long]
        cut = np.concatenate(cuts)
        # Cuts lie strictly inside their text, so sorting keeps every text's pieces together
        # (an empty text stays one empty piece).
        edges = np.sort(np.concatenate((bounds, cut)), kind="stable")
        pieces = pa.LargeStringArray.from_buffers(len(edges) - 1, pa.py_buffer(edges), data)
        per_text = 1 + np.bincount(np.searchsorted(bounds, cut, side="right") - 1, minlength=len(arr))
        flat, piece_len, ids_seconds = self._encode_pieces(pieces, edges)
        if timings is not None:
            timings[IDS_TIMING] += ids_seconds
        text_len = np.add.reduceat(piece_len, np.cumsum(per_text) - per_text) if len(arr) else piece_len
        offsets = np.zeros(len(arr) + 1, dtype=np.int64)
        np.cumsum(text_len, out=offsets[1:])
        return _offsets_to_list_array(flat, offsets)

    def _encode_pieces(self, pieces: pa.LargeStringArray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """(flat int32 ids, ids per piece, seconds copying ids): batched calls of at most
        ENCODE_CHUNK pieces and about ENCODE_BYTES of text; the tokenizer's batched call is the
        one per-text step the pipeline has (DESIGN §3)."""
        flats, lengths = [np.zeros(0, np.int32)], [np.zeros(0, np.int64)]
        start, ids_seconds = 0, 0.0
        while start < len(pieces):
            by_bytes = int(np.searchsorted(edges, edges[start] + ENCODE_BYTES, side="right")) - 1
            stop = max(start + 1, min(start + ENCODE_CHUNK, by_bytes, len(pieces)))
            batch = self._tok.encode_batch_fast(pieces.slice(start, stop - start).to_pylist(), add_special_tokens=False)
            started = time.perf_counter()
            flat, length = flatten_ids(batch)
            del batch  # the Encodings are the bulk of a call's memory
            ids_seconds += time.perf_counter() - started
            flats.append(flat)
            lengths.append(length)
            start = stop
        return np.concatenate(flats), np.concatenate(lengths), ids_seconds

    @property
    def cuttable(self) -> bool:
        """Whether long texts may be cut at `cut_points` without changing a single id."""
        if not hasattr(self, "_cuttable_cache"):
            self._cuttable_cache = cuttable(self._tok)
        return self._cuttable_cache

    def encode(self, text: str) -> list[int]:
        """Encode one string as text (the interface `etl.sft` expects)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def special_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def special_strip(self, token: str) -> tuple[bool, bool]:
        """(lstrip, rstrip) of an added token: whether it swallows whitespace on that side."""
        for added in self._tok.get_added_tokens_decoder().values():
            if added.content == token:
                return bool(added.lstrip), bool(added.rstrip)
        return False, False

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """Display text per id; a character split over several tokens (CJK, emoji in byte-level
        BPE or byte fallback) shows whole on its first token and as "" on the rest."""
        return join_utf8_pieces([self._token_bytes(int(i)) for i in ids], ids, self._tok)

    def _token_bytes(self, tid: int) -> bytes | None:
        """The raw bytes a token stands for; None for added tokens (shown by their content)."""
        token = self._tok.id_to_token(tid)
        if token is None or tid in self._added_ids:
            return None
        if self._byte_level:
            return bytes(_BYTE_DECODER.get(ch, 0x3F) for ch in token)
        if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):  # byte fallback
            return bytes([int(token[3:5], 16)])
        return token.replace("\u2581", " ").encode("utf-8")

    @property
    def _added_ids(self) -> set[int]:
        if not hasattr(self, "_added_cache"):
            self._added_cache = set(self._tok.get_added_tokens_decoder())
        return self._added_cache

    @property
    def _byte_level(self) -> bool:
        if not hasattr(self, "_byte_level_cache"):
            spec = json.loads(self._tok.to_str())
            self._byte_level_cache = (spec.get("decoder") or {}).get("type") == "ByteLevel"
        return self._byte_level_cache


# Cutting a long text: where a piece may end without changing any id.
#
# A cut at byte p is safe when the tokenizer's pre-tokenizer starts a new piece at p in the whole
# text and scans text[:p] and text[p:] alone exactly as it scans them inside the whole (then the
# BPE model, which works per pre-token, gives the same ids). `cut_points` cuts only (A) after a
# single "\n" between two non-space characters, or (B) at a " " between two ASCII letters.
# Proved for these split regexes (none has a lookbehind; at (A) every alternative that can hold
# the "\n" ends with it, and the one chosen there is the same whether or not text follows; at (B)
# the letter run ends at the space and " word" starts there), and checked by
# tests/test_record_size.py against whole encodes with Qwen2.5 and trained GPT-2/Llama-3 models:
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


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table that byte-level BPE vocabularies are written in."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = keep[:]
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(keep, map(chr, chars), strict=True))


_BYTE_DECODER = {ch: b for b, ch in _bytes_to_unicode().items()}


def join_utf8_pieces(pieces: list[bytes | None], ids: Sequence[int], tok: Any) -> list[str]:
    """Decode token byte pieces for display, joining the pieces of one character.

    A piece that is not valid UTF-8 alone is joined with the following pieces (up to 4) until
    the bytes decode; the text goes on the first token of the group, "" on the others. Added
    tokens (None) show their content.
    """
    out: list[str] = []
    i = 0
    while i < len(pieces):
        if pieces[i] is None:
            out.append(tok.id_to_token(int(ids[i])) or "")
            i += 1
            continue
        text, width = _decode_group(pieces, i)
        out.extend([text] + [""] * (width - 1))
        i += width
    return out


def _decode_group(pieces: list[bytes | None], i: int) -> tuple[str, int]:
    for j in range(i + 1, min(i + 5, len(pieces)) + 1):
        if pieces[j - 1] is None:
            break
        try:
            return b"".join(pieces[i:j]).decode("utf-8"), j - i  # type: ignore[arg-type]
        except UnicodeDecodeError:
            continue
    return pieces[i].decode("utf-8", errors="replace"), 1  # type: ignore[union-attr]


def load_tokenizer(spec: str | os.PathLike[str], *, special_tokens: Sequence[str] = ()) -> TextTokenizer:
    """Load `bytes` (built-in; registers `special_tokens` from id 256) or a tokenizer path.

    Special tokens are never added to a real tokenizer's vocabulary: templates check that theirs
    exist and fail with the missing name otherwise.
    """
    if str(spec) == BYTES:
        return ByteTokenizer(special_tokens)
    if not Path(spec).exists():
        raise EtlError(f"tokenizer {spec} does not exist; pass `bytes`, a tokenizer.json or a model directory")
    return HFTokenizer(spec)


def load_tokenizer_from_manifest(manifest: dict[str, Any]) -> TextTokenizer:
    """Rebuild the tokenizer a finished run used (for `etl inspect` and friends)."""
    info = manifest["tokenizer"]
    if info["name"] == BYTES:
        specials = sorted(manifest.get("special_ids", {}).items(), key=lambda kv: kv[1])
        return ByteTokenizer([tok for tok, _ in specials])
    return HFTokenizer(info["path"])


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
            ids.extend(tokenizer.encode_texts(pa.array([piece]))[0].as_py())
    return ids
