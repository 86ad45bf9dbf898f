"""`ContentBackend`: which library encodes a Hugging Face tokenizer's content in a run
(`--tokenizer-backend`), and the per-run proof that gigatoken gives `tokenizers`' ids.

`auto` settles per run (`plan`): `tokenizers` under `AUTO_MIN_BYTES` of input, else gigatoken,
loaded on a thread while the first chunks parse. Before gigatoken encodes a run's texts, up to
`VERIFY_TEXTS` texts (`VERIFY_BYTES`) spread over the first encodes go through both; any
difference sends an `auto` run back to `tokenizers` with one warning and stops a `gigatoken` one.
"""

from __future__ import annotations

import concurrent.futures
import functools
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from etl.arrow_values import string_offsets
from etl.errors import EtlError, EtlWarning
from etl.tokens import gigatoken_encoder as fast
from etl.tokens.gigatoken_encoder import AUTO, GIGATOKEN, HF

# (flat int32 ids, ids per piece, seconds copying ids): `tokenizers`' encode of some pieces
Encoded = tuple[np.ndarray, np.ndarray, float]
# `auto` below this much input (compressed bytes for .gz/.zst) encodes with `tokenizers`: gigatoken
# costs ~0.5 s to load Qwen2.5 and ~0.15 s at its first call, about what `tokenizers` spends on
# AUTO_MIN_BYTES of chat JSON on 2 cores (bench/results.md, section 1).
AUTO_MIN_BYTES = 4 << 20
# Texts of a run's first encodes that both encoders see before gigatoken is trusted, at most
# VERIFY_BYTES of them: `tokenizers` encodes ~3 MB/s on 2 cores, so ~0.1 s once per run.
VERIFY_TEXTS = 2000
VERIFY_BYTES = 256 << 10


def settle(requested: str, input_bytes: int) -> str:
    """The backend a run over `input_bytes` of input asks for: `auto` under AUTO_MIN_BYTES is `hf`
    (gigatoken's fixed cost would exceed what it saves); the local engine and Ray workers alike."""
    return HF if requested == AUTO and input_bytes < AUTO_MIN_BYTES else requested


class ContentBackend:
    """The backend `requested` (auto, hf, gigatoken) for tokenizer.json `raw` named `name`;
    `used`: the one that encoded the last texts (None: none yet)."""

    def __init__(self, requested: str, raw: bytes, name: str) -> None:
        self.requested, self.name = requested, name
        self.used: str | None = None
        self._raw: bytes | None = raw if requested != HF else None  # until gigatoken reads it
        self._loading: concurrent.futures.Future[Any] | None = None
        self._checked = [0, 0]  # texts and bytes both encoders have seen

    def plan(self, input_bytes: int, *, preload: bool) -> None:
        """Settle `auto` for a run over `input_bytes` of input; `preload`: start loading gigatoken
        (`gigatoken` asked for by name loads now: a tokenizer it cannot read stops the run here,
        with one line, before any chunk is processed)."""
        if settle(self.requested, input_bytes) == HF:
            self.requested, self._raw = HF, None
        elif self.requested == GIGATOKEN:
            self.fast  # noqa: B018 - raises EtlError now
        elif preload:
            self.preload()

    def preload(self) -> None:
        """Load gigatoken on a thread (~0.5 s for Qwen2.5) so that the first encode finds it ready.
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
            return fast.load(raw, self.name)
        except EtlError:
            if self.requested == GIGATOKEN:
                raise
            return None

    def ids(self, pieces: pa.LargeStringArray, reference: Callable[[pa.LargeStringArray], Encoded]) -> Encoded:
        """The pieces' ids from the run's backend; `reference`: `tokenizers`' encode."""
        if self.fast is not None and self._checked[0] < VERIFY_TEXTS and self._checked[1] < VERIFY_BYTES:
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
        flat, lengths, seconds = reference(pieces.take(odd))
        merged = fast.merge(len(pieces), [(odd, (flat, lengths)), (rest, fast.encode(self.fast, pieces.take(rest)))])
        return (*merged, seconds)

    def _verify(self, pieces: pa.LargeStringArray, reference: Callable[[pa.LargeStringArray], Encoded]) -> None:
        """Compare both on texts spread over `pieces`; on a difference `auto` drops gigatoken."""
        index = fast.sample(len(pieces), VERIFY_TEXTS - self._checked[0])
        offsets = string_offsets(pieces)
        within = np.cumsum(np.diff(offsets)[index]) <= VERIFY_BYTES - self._checked[1]
        if not within.all():  # fewer texts, still spread over the chunk: about VERIFY_BYTES of them
            index = fast.sample(len(pieces), max(1, int(within.sum())))
        some = pieces.take(index)
        self._checked[0] += len(some)
        self._checked[1] += some.buffers()[2].size if some.buffers()[2] is not None else 0
        differs = fast.first_difference(reference(some)[:2], self._routed(some, reference)[:2])
        if differs is None:
            return
        text = some[differs].as_py()
        shown = text if len(text) <= 80 else text[:77] + "..."
        if self.requested == GIGATOKEN:
            raise EtlError(f"tokenizer backend gigatoken gives other ids than tokenizers for {shown!r} with "
                           f"tokenizer {self.name}; pass --tokenizer-backend hf (or auto, which falls back)")
        warnings.warn(f"tokenizer backend: gigatoken gives other ids than tokenizers for {shown!r}; this run "
                      "encodes with tokenizers (hf)", EtlWarning, stacklevel=2)
        self.__dict__["fast"] = None
