"""Hugging Face `tokenizers` tokenizers behind `TextTokenizer`: batched encoding of Arrow strings
(long texts cut where `cutting` proves it safe), ids copied to numpy, token display strings."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import operator
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from etl.arrow_values import string_offsets
from etl.errors import EtlError
from etl.tokens.backend import ENCODER_IN_KEY, ContentBackend
from etl.tokens.cutting import cut_points, cuttable
from etl.tokens.gigatoken_encoder import AUTO, GIGATOKEN, HF
from etl.tokens.hf_pipeline import as_transformers, describe
from etl.tokens.token_display import TokenDisplay
from etl.tokens.tokenizer import IDS_TIMING, as_large_string, offsets_to_list_array

# Strings per encode_batch call: on one huge batch encode_batch_fast ran slower than encode_batch
# here (docs/design.md, Measured costs); chunks of ~1k strings recover that and keep the Rust
# thread pool busy.
ENCODE_CHUNK = 1024
# Text bytes per encode_batch call too: the Encoding objects of a call hold ~260 B per token
# (ids, type ids, token strings, offsets, masks) until their ids are copied out, so a call is
# bounded by size as well as by count: ~80 MB for 1 MiB of Qwen2.5 text (4 MiB added ~0.1 GB
# to the peak of bench/big_record.py). Chat turns are ~1 KiB: 1,024 of them still fit.
ENCODE_BYTES = 1 << 20
# A text longer than this is encoded in pieces of about this size (`cut_points`):
# one encode of a 20 MB message peaked at 2.5 GB (bench/big_record.py) and ran on one thread.
PIECE_BYTES = 1 << 16
# How content is encoded, beyond the tokenizer file: part of the token cache's key (`cache_key`),
# so a change here starts a new cache rather than serving ids encoded the old way.
CONTENT_ENCODING = "text: encode_special_tokens, added tokens as special, no special tokens added"


_IDS = operator.attrgetter("ids")


def flatten_ids(batch: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(flat int32 ids, ids per encoding) of a batch of `tokenizers.Encoding`s.

    `Encoding.ids` builds a Python list of Python ints (most of this step; tokenizers has no
    buffer or numpy output), so the copy is at best one C-level pass over those ints. Making
    each list only when `np.fromiter` reaches it, and dropping it right after, keeps the ints
    in cache and holds one list at a time instead of ~40 B per token of the whole batch: less
    CPU than building every list first (bench/hot_path.py), and than converting the lists with
    `pa.array(..., pa.large_list(pa.int32()))`, `np.concatenate` of per-list arrays or
    `Encoding.merge` (the measurements: docs/design.md, Measured costs).
    """
    lengths = np.fromiter(map(len, batch), dtype=np.int64, count=len(batch))
    ids = itertools.chain.from_iterable(map(_IDS, batch))
    return np.fromiter(ids, dtype=np.int32, count=int(lengths.sum())), lengths


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer from `tokenizer.json` or a model directory.

    `lazy`: parse tokenizer.json (Qwen2.5's is 7 MB: docs/token-cache.md) only when something
    needs it. The small questions a run asks (special ids, template pieces' ids, vocabulary size)
    are kept in `answers`, which the token cache saves per tokenizer file (`remember`): a rerun
    whose every answer and every text is cached never parses it.

    `backend`: what encodes content (`encode_texts`): `hf` (`tokenizers`), `gigatoken`, or `auto`
    (`content`, a `ContentBackend`, which checks gigatoken against `tokenizers` on each run).
    """

    def __init__(self, path: str | os.PathLike[str], *, lazy: bool = False, backend: str = AUTO) -> None:
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
        self._raw: bytes | None = file.read_bytes()  # parsed by `_tok`: the bytes `sha256` names
        self.sha256 = hashlib.sha256(self._raw).hexdigest()
        config = file.with_name("tokenizer_config.json")
        self.config: dict[str, Any] = json.loads(config.read_text("utf-8")) if config.is_file() else {}
        # How transformers rebuilds this class's pipeline (etl.tokens.hf_pipeline), or None.
        self.pipeline = describe(self.config)
        self.answers: dict[str, Any] = {}
        self.new_answers = False  # answers computed by this process, not remembered
        if self.pipeline is not None:
            # gigatoken reads tokenizer.json as written, not transformers' rebuilt pipeline.
            if backend == GIGATOKEN:
                raise EtlError(f"tokenizer {path}: --tokenizer-backend gigatoken reads tokenizer.json as written, "
                               f"but transformers encodes this tokenizer {self.pipeline}; use auto or hf")
            backend = HF
        self.content = ContentBackend(backend, self._raw, self.name)
        if self.pipeline is not None:
            self.content.reason = f"gigatoken reads tokenizer.json as written; transformers encodes it {self.pipeline}"
        if not lazy:
            self._tok  # noqa: B018 - parse now: a broken file fails here, not at the first question

    @functools.cached_property
    def _tok(self) -> Any:
        # tokenizers: only when a tokenizer loads
        from tokenizers import Tokenizer

        assert self._raw is not None
        try:
            tok = Tokenizer.from_str(self._raw.decode("utf-8"))
        except Exception as exc:  # tokenizers raises a bare Exception for any bad file
            raise EtlError(
                f"tokenizer {self.name}: {Path(self.path).name} is not a Hugging Face tokenizers file ({exc}); "
                "pass a tokenizer.json or the model directory that holds one"
            ) from exc
        self._raw = None
        # Content is data, never control: special-token strings in content encode as text.
        tok.encode_special_tokens = True
        # So do the non-special added tokens (Qwen's <tool_call>, <think>, <tool_response>):
        # re-added as special, they too are text in content; templates insert them by id
        # (`encode_template_text`). transformers maps them in content; etl does not, on purpose.
        tok.add_special_tokens([_as_special(t) for t in tok.get_added_tokens_decoder().values() if not t.special])
        return as_transformers(tok, self.config)

    def remember(self, answers: dict[str, Any]) -> None:
        """Take answers an earlier run with this same tokenizer file gave (the token cache's)."""
        self.answers.update(answers)

    def _answer(self, question: str, compute: Callable[[], Any]) -> Any:
        if question not in self.answers:
            self.answers[question] = compute()
            self.new_answers = True
        return self.answers[question]

    @property
    def vocab_size(self) -> int:
        return int(self._answer("vocab_size", lambda: self._tok.get_vocab_size(with_added_tokens=True)))

    @property
    def cache_key(self) -> str:
        """Everything a text's ids depend on besides the text (`etl.cache`): the tokenizer file,
        the tokenizers version and how content is encoded (long texts' cuts change no id); the
        encoder that made them is in each text's key (`etl.cache.keys.tagged`)."""
        # tokenizers: only when a tokenizer loads
        import tokenizers

        return json.dumps({"tokenizer_sha256": self.sha256, "tokenizers": tokenizers.__version__,
                           "content": CONTENT_ENCODING, "encoder": ENCODER_IN_KEY, **({"pipeline": self.pipeline} if self.pipeline else {})},
                          sort_keys=True)

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
        arr = as_large_string(texts)
        bounds = string_offsets(arr)
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
        flat, piece_len, ids_seconds = self.content.ids(pieces, self._encode_pieces)
        if timings is not None:
            timings[IDS_TIMING] += ids_seconds
        text_len = np.add.reduceat(piece_len, np.cumsum(per_text) - per_text) if len(arr) else piece_len
        offsets = np.zeros(len(arr) + 1, dtype=np.int64)
        np.cumsum(text_len, out=offsets[1:])
        return offsets_to_list_array(flat, offsets)

    def plan(self, input_bytes: int) -> None:
        """Settle the content backend for a run over `input_bytes` of input (`ContentBackend.plan`);
        gigatoken preloads unless tokenizer.json was not even parsed (a warm token cache may hold
        every text)."""
        self.content.plan(input_bytes, preload="_tok" in self.__dict__)

    @property
    def backend_used(self) -> str | None:
        """The backend that encoded the last texts (None: none yet)."""
        return self.content.used

    @backend_used.setter
    def backend_used(self, name: str | None) -> None:  # a Ray driver's: the one its workers used
        self.content.used = name

    def _encode_pieces(self, pieces: pa.LargeStringArray) -> tuple[np.ndarray, np.ndarray, float]:
        """(flat int32 ids, ids per piece, seconds copying ids) from `tokenizers`: batched calls of
        at most ENCODE_CHUNK pieces and about ENCODE_BYTES of text; the tokenizer's batched call
        is the one per-text step the pipeline has (content is tokenized per turn in one batched call)."""
        edges = string_offsets(pieces)
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

    def encode_fixed(self, text: str) -> list[int]:
        """`encode` of a text the run's settings fix (a template piece, the default system prompt),
        remembered in `answers`."""
        return list(self._answer("encode:" + text, lambda: self.encode(text)))

    def special_id(self, token: str) -> int | None:
        return self._answer("id:" + token, lambda: self._tok.token_to_id(token))

    def surely_absent(self, token: str) -> bool:
        """True when `special_id(token)` is surely None without parsing tokenizer.json: the string
        is nowhere in its text (a vocabulary entry or an added token is written there literally, or
        JSON-escaped). False when that is unknown (the file already parsed, or the string in it)."""
        if self._raw is None or "id:" + token in self.answers:
            return False
        return all(form.encode() not in self._raw for form in {token, json.dumps(token)[1:-1]})

    def token_to_id(self, token: str) -> int | None:
        return self.special_id(token)

    def special_strip(self, token: str) -> tuple[bool, bool]:
        """(lstrip, rstrip) of an added token: whether it swallows whitespace on that side."""
        lstrip, rstrip = self._answer("strip:" + token, lambda: self._strip(token))
        return bool(lstrip), bool(rstrip)

    def _strip(self, token: str) -> list[bool]:
        for added in self._tok.get_added_tokens_decoder().values():
            if added.content == token:
                return [bool(added.lstrip), bool(added.rstrip)]
        return [False, False]

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """Display text per id; a character split over several tokens (CJK, emoji in byte-level
        BPE or byte fallback) shows whole on its first token and as "" on the rest."""
        if not hasattr(self, "_display"):
            self._display = TokenDisplay(self._tok)
        return self._display.strings(ids)


def _as_special(token: Any) -> Any:
    # tokenizers: only when a tokenizer loads
    from tokenizers import AddedToken

    return AddedToken(token.content, single_word=token.single_word, lstrip=token.lstrip, rstrip=token.rstrip,
                      normalized=token.normalized, special=True)
