"""`ContentBackend`: which library encodes a Hugging Face tokenizer's content in a run
(`--tokenizer-backend`), and the per-run check that gigatoken gives `tokenizers`' ids.

gigatoken encodes only tokenizers whose options `gigatoken_allowed.ALLOWED` lists (proven equal);
for any other `auto` uses `tokenizers` and says why (`reason`, the manifest's
`token_cache.backend_reason`), and `gigatoken` asked for by name is an error. `auto` also settles
per run (`plan`): `tokenizers` under `AUTO_MIN_BYTES` of input, else gigatoken, loaded on a thread
while the first chunks parse.

The check, a second line: texts spread over every encode of the run go through both libraries,
the whole of the first VERIFY_TEXTS / VERIFY_BYTES, then VERIFY_SHARE of each call's texts. A
difference before gigatoken's ids left unchecked texts sends an `auto` run to `tokenizers` with one
warning (nothing it wrote came from an unchecked gigatoken id); a later one stops the run (ids
already written may differ). `--tokenizer-backend gigatoken` stops on any difference.
"""

from __future__ import annotations

import concurrent.futures
import functools
import importlib.metadata
import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from etl.arrow_values import from_numpy, string_offsets
from etl.errors import EtlError, EtlWarning
from etl.tokens import gigatoken_allowed as allowed
from etl.tokens import gigatoken_encoder as fast
from etl.tokens.gigatoken_encoder import AUTO, GIGATOKEN, HF

# (flat int32 ids, ids per piece, seconds copying ids): `tokenizers`' encode of some pieces
Encoded = tuple[np.ndarray, np.ndarray, float]
# `auto` below this much input (compressed bytes for .gz/.zst) encodes with `tokenizers`: loading
# gigatoken and its first call cost about what `tokenizers` spends on AUTO_MIN_BYTES of chat JSON
# on 2 cores (docs/design.md, Measured costs; bench/results.md, section 1).
AUTO_MIN_BYTES = 4 << 20
# Texts of a run's first encodes that both encoders see before gigatoken is trusted, at most
# VERIFY_BYTES of them: a fraction of a second of `tokenizers` once per run (docs/design.md,
# Measured costs).
VERIFY_TEXTS = 2000
VERIFY_BYTES = 256 << 10
# Then this share of every later encode's texts (and at most of its bytes; one text at least),
# spread over the call, so every chunk of the input is sampled (its cost: docs/tokenizers.md).
VERIFY_SHARE = 1 / 1024
# The encoder tag of ids `tokenizers` made: the reference, which any run may be served.
TOKENIZERS_IDS = "tokenizers"
# How a cached text's key names the encoder that made its ids (`etl.cache.keys.tagged`); part of
# every token cache namespace's key (`HFTokenizer.cache_key`), so a cache written before encoders
# were named (where gigatoken's ids of any tokenizer sat under tokenizers' keys) is never read.
ENCODER_IN_KEY = "md5(text) for tokenizers' ids; xor md5(encoder tag) for another encoder's"


def settle(requested: str, input_bytes: int) -> str:
    """The backend a run over `input_bytes` of input asks for: `auto` under AUTO_MIN_BYTES is `hf`
    (gigatoken's fixed cost would exceed what it saves); the local engine and Ray workers alike."""
    return HF if requested == AUTO and input_bytes < AUTO_MIN_BYTES else requested


class ContentBackend:
    """The backend `requested` (auto, hf, gigatoken) for tokenizer.json `raw` named `name`;
    `used`: the one that encoded the last texts (None: none yet)."""

    def __init__(self, requested: str, raw: bytes, name: str) -> None:
        self.requested, self.name = requested, name
        self.asked = requested  # before `plan` settles it: which cached ids the run accepts
        self.used: str | None = None
        self.reason: str | None = "asked for (--tokenizer-backend hf)" if requested == HF else None
        self._raw: bytes | None = raw if requested != HF else None  # until gigatoken reads it
        self._loading: concurrent.futures.Future[Any] | None = None
        self._checked = [0, 0]  # texts and bytes both encoders have seen
        self._unchecked = False  # whether gigatoken gave ids of texts both did not see

    def plan(self, input_bytes: int, *, preload: bool) -> None:
        """Settle `auto` for a run over `input_bytes` of input; `preload`: start loading gigatoken
        (`gigatoken` asked for by name loads now: a tokenizer it cannot read stops the run here,
        with one line, before any chunk is processed)."""
        if settle(self.requested, input_bytes) == HF:
            if self.requested == AUTO:
                self.reason = f"auto: input under {AUTO_MIN_BYTES >> 20} MiB"
            self.requested, self._raw = HF, None
        elif self.requested == GIGATOKEN:
            self.fast  # noqa: B018 - raises EtlError now
        elif preload:
            self.preload()

    def preload(self) -> None:
        """Load gigatoken on a thread so that the first encode finds it ready (its load time:
        docs/design.md, Measured costs).
        No-op for `hf` or once started."""
        if self.requested == HF or "fast" in self.__dict__ or self._loading is not None:
            return
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="etl-gigatoken")
        self._loading = pool.submit(self._load)
        pool.shutdown(wait=False)  # the thread ends with its one load

    @functools.cached_property
    def fast(self) -> Any:
        """The gigatoken tokenizer, or None: `tokenizers` (`hf`, or `auto` where gigatoken is
        missing or cannot read this tokenizer)."""
        if self.requested == HF:
            return None
        return self._load() if self._loading is None else self._loading.result()

    def _load(self) -> Any:
        raw, self._raw = self._raw, None
        assert raw is not None
        try:
            refused = allowed.refusal(allowed.components(raw))
        except (ValueError, AttributeError) as exc:  # not JSON, or not a tokenizer.json's shape
            refused = f"its tokenizer.json cannot be read ({type(exc).__name__})"
        if refused is not None:
            if self.requested == GIGATOKEN:
                raise EtlError(f"tokenizer backend gigatoken may not encode tokenizer {self.name}: {refused}; "
                               "pass --tokenizer-backend auto (which uses tokenizers for it) or hf")
            self.reason = f"gigatoken may not encode it: {refused}"
            return None
        try:
            return fast.load(raw, self.name)
        except EtlError as exc:
            if self.requested == GIGATOKEN:
                raise
            self.reason = str(exc).split("; ", 1)[0].removeprefix("tokenizer backend ")  # without the advice
            return None

    @functools.cached_property
    def gigatoken_ids(self) -> str | None:
        """The encoder tag of gigatoken's ids (its version and the allow-list's), or None where
        gigatoken is not installed. The token cache keeps each encoder's ids apart by this tag."""
        try:
            version = importlib.metadata.version("gigatoken")  # without importing it: milliseconds
        except importlib.metadata.PackageNotFoundError:
            return None
        return f"gigatoken {version}, allowed v{allowed.ALLOWED_VERSION}"

    def served(self) -> list[str]:
        """Encoder tags whose cached ids this run may be served: `tokenizers`' always (the
        reference); gigatoken's (of this version) only where the run asked for auto or gigatoken
        and has not found it to differ."""
        trusted = self.asked != HF and "fast" not in self.__dict__ or self.__dict__.get("fast") is not None
        return [TOKENIZERS_IDS, *([self.gigatoken_ids] if trusted and self.gigatoken_ids else [])]

    @property
    def made(self) -> str:
        """The encoder tag of the last ids `ids` gave (texts routed to `tokenizers` included)."""
        return TOKENIZERS_IDS if self.used != GIGATOKEN else (self.gigatoken_ids or GIGATOKEN)

    def ids(self, pieces: pa.LargeStringArray, reference: Callable[[pa.LargeStringArray], Encoded]) -> Encoded:
        """The pieces' ids from the run's backend; `reference`: `tokenizers`' encode."""
        if self.fast is not None and len(pieces):
            self._verify(pieces, reference)
        if self.fast is None:
            self.used = HF
            return reference(pieces)
        self.used = GIGATOKEN
        return self._routed(pieces, reference)

    def _routed(self, pieces: pa.LargeStringArray, reference: Callable[[pa.LargeStringArray], Encoded]) -> Encoded:
        """gigatoken's ids, but `tokenizers`' for the texts whose characters the two libraries may
        read differently (`fast.needs_reference`); the seconds are `reference`'s."""
        odd = fast.needs_reference(pieces)
        if not len(odd):
            return (*fast.encode(self.fast, pieces), 0.0)
        rest = np.setdiff1d(np.arange(len(pieces)), odd)
        flat, lengths, seconds = reference(pieces.take(from_numpy(odd)))
        merged = fast.merge(len(pieces), [(odd, (flat, lengths)), (rest, fast.encode(self.fast, pieces.take(from_numpy(rest))))])
        return (*merged, seconds)

    def _verify(self, pieces: pa.LargeStringArray, reference: Callable[[pa.LargeStringArray], Encoded]) -> None:
        """Compare both on texts spread over `pieces` (see the module); on a difference `auto` drops
        gigatoken, or stops when gigatoken already gave ids of texts the check did not see."""
        offsets = string_offsets(pieces)
        size = int(offsets[-1] - offsets[0])
        texts = max(0, VERIFY_TEXTS - self._checked[0]) + math.ceil(len(pieces) * VERIFY_SHARE)
        budget = max(0, VERIFY_BYTES - self._checked[1]) + math.ceil(size * VERIFY_SHARE)
        sizes = np.diff(offsets)
        index = fast.sample(len(pieces), texts)
        while len(index) > 1 and (got := int(sizes[index].sum())) > budget:  # fewer, still spread over the call
            index = fast.sample(len(pieces), min(len(index) - 1, len(index) * budget // got))
        some = pieces.take(from_numpy(index))  # a numpy index would import pandas (0.13 s)
        self._checked[0] += len(some)
        self._checked[1] += int(sizes[index].sum())
        differs = fast.first_difference(reference(some)[:2], self._routed(some, reference)[:2])
        if differs is None:
            self._unchecked |= len(some) < len(pieces)
            return
        text = some[differs].as_py()
        shown = text if len(text) <= 80 else text[:77] + "..."
        if self.requested == GIGATOKEN or self._unchecked:
            raise EtlError(f"tokenizer backend gigatoken gives other ids than tokenizers for {shown!r} with "
                           f"tokenizer {self.name}" + ("" if self.requested == GIGATOKEN else
                                                       ", after it encoded texts the check did not see")
                           + "; pass --tokenizer-backend hf" + ("" if self._unchecked else
                                                                " (or auto, which falls back)"))
        warnings.warn(f"tokenizer backend: gigatoken gives other ids than tokenizers for {shown!r}; this run "
                      "encodes with tokenizers (hf)", EtlWarning, stacklevel=2)
        self.reason = f"gigatoken gave other ids than tokenizers for {shown!r}"
        self.__dict__["fast"] = None
