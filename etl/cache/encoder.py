"""`Encoder`: the run's one way to tokenize text. Repeats in a batch are tokenized once, and with
a cache, texts tokenized by this or an earlier run are read back instead of tokenized again.

Per batch (a chunk's contents, its reasoning, its tool calls): distinct texts (`keys.distinct`),
their MD5 keys, the cache's ids for those it holds (`store.SegmentStore`), the tokenizer for the
rest, one gather back to every row. Ids are the tokenizer's own either way (tests/cache compare
them cold, warm, disabled and after a damaged segment). A failed cache write (a full disk, a link
below the root) turns the cache off for the rest of the run (`etl.cache.guard`): every text is
then tokenized, as with --no-cache.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import duckdb
import numpy as np
import pyarrow as pa

from etl.arrow_values import from_numpy, numbers_of
from etl.cache import folder as fo
from etl.cache.folder import CacheSettings
from etl.cache.guard import CacheGuard
from etl.cache.keys import content_keys, distinct, tagged
from etl.cache.store import SegmentStore
from etl.ragged import gather_pieces
from etl.tokens.gigatoken_encoder import GIGATOKEN, HF
from etl.tokens.tokenizer import TextTokenizer, offsets_to_list_array

TOKENIZER, CACHE, SAVED = "tokenizer", "token_cache", "token_cache_saved"


@dataclass
class EncodeStats:
    """What the run asked the tokenizer for, and where the ids came from."""

    strings: int = 0  # texts the pipeline encoded
    distinct: int = 0  # after repeats within each batch
    from_cache: int = 0  # distinct texts read from the cache (or from an earlier chunk of this run)
    tokenized: int = 0  # texts the tokenizer saw
    tokens_from_cache: int = 0
    tokens_tokenized: int = 0
    segments_written: int = 0
    segments_damaged: int = 0  # failed their checksum: ignored, removed, their texts tokenized again
    tokenizer_seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        body = dataclasses.asdict(self)
        del body["tokenizer_seconds"]  # the manifest holds no timings
        body["hit_rate"] = round(self.from_cache / self.distinct, 4) if self.distinct else 0.0
        return body

    def add(self, other: EncodeStats, sign: int = 1) -> None:
        """Add (sign -1: take away) another's counts: a Ray worker's chunk into the driver's."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + sign * getattr(other, f.name))


class Encoder:
    """Encode text arrays through repeats and the cache; `close` writes what is new and reports."""

    def __init__(self, tokenizer: TextTokenizer, settings: CacheSettings | None = None) -> None:
        self.tokenizer = tokenizer
        self.key = getattr(tokenizer, "cache_key", None)  # None: the bytes tokenizer, nothing to save
        self.stats = EncodeStats()
        self.guard = settings.guard if settings else CacheGuard()
        root = settings.root if settings and self.key else None
        self.root = self.guard.attempt(root, lambda: fo.open_root(root)) if root is not None else None
        self.limit = settings.max_bytes if settings else 0
        self._store: SegmentStore | None = None  # opened at the first encode (a Ray driver never does)
        self.con = duckdb.connect() if self.root else None
        self.lock = threading.Lock()  # Polars may run two of a chunk's encodes at once
        self.closed = False
        # This tokenizer's folder of the cache (made, with its key file, when missing); None: no cache.
        self.space = self._open_space()
        if self.space is not None and hasattr(tokenizer, "remember"):
            tokenizer.remember(fo.read_answers(self.space))

    def _open_space(self) -> Path | None:
        root, key = self.root, self.key
        if root is None or key is None:
            return None
        return self.guard.attempt(root, lambda: fo.namespace(root, key))

    @property
    def store(self) -> SegmentStore | None:
        """The cache's segments for this tokenizer (None: no cache, or off after a failed write);
        its index is read on first use."""
        if self._store is None and self.space is not None and self.root is not None:
            root, space = self.root, self.space
            self._store = self.guard.attempt(root, lambda: SegmentStore(space, root, self.guard))
        return None if self.guard.off else self._store

    def _sync(self) -> EncodeStats:
        if self._store is not None:
            self.stats.segments_written, self.stats.segments_damaged = self._store.written, self._store.corrupt
        return self.stats

    def encode(self, texts: pa.Array, timings: Counter[str] | None = None) -> pa.LargeListArray:
        """Ids of every text (a large_list<int32> array), as `TextTokenizer.encode_texts` gives them."""
        timings = Counter() if timings is None else timings
        if self.key is None or not len(texts):
            return self._tokenize(texts, timings)
        with self.lock:
            started, before = time.perf_counter(), self.stats.tokenizer_seconds
            self.stats.strings += len(texts)
            repeats = distinct(texts)
            unique = texts if repeats is None else texts.take(from_numpy(repeats[0]))
            self.stats.distinct += len(unique)
            store = self.store  # once: the parsing thread may turn the cache off meanwhile
            if store is None:
                sources, source, row = [self._tokenize(unique, timings)], np.zeros(len(unique), np.int64), None
            else:
                sources, source, row = self._cached(store, unique, timings)
            if repeats is not None:
                source, row = source[repeats[1]], (np.arange(len(unique)) if row is None else row)[repeats[1]]
            out = gather(sources, source, row)
            timings[CACHE] += time.perf_counter() - started - (self.stats.tokenizer_seconds - before)
            return out

    def _tokenize(self, texts: pa.Array, timings: Counter[str]) -> pa.LargeListArray:
        started = time.perf_counter()
        ids = self.tokenizer.encode_texts(texts, timings=timings)
        seconds = time.perf_counter() - started
        timings[TOKENIZER] += seconds
        self.stats.tokenizer_seconds += seconds
        self.stats.tokenized += len(texts)
        self.stats.tokens_tokenized += len(ids.values)
        return ids

    def _cached(self, store: SegmentStore, texts: pa.Array,
                timings: Counter[str]) -> tuple[list[pa.LargeListArray], np.ndarray, np.ndarray]:
        """(id arrays, which array and row holds each text's ids): the cache's segments where they
        hold the text (checked key by key), then the tokenizer's ids of the rest."""
        assert self.con is not None
        keys = content_keys(texts, self.con)
        sources: list[pa.LargeListArray] = []
        source, row = np.full(len(texts), -1, np.int64), np.zeros(len(texts), np.int64)
        content = getattr(self.tokenizer, "content", None)  # an HFTokenizer's `ContentBackend`
        for tag in content.served() if content is not None else [None]:
            if (todo := np.flatnonzero(source < 0)).size:
                self._serve(store, todo, tagged(keys[todo], tag), sources, source, row)
        missed = np.flatnonzero(source < 0)
        self.stats.from_cache += len(texts) - len(missed)
        if len(missed):
            fresh = self._tokenize(texts.take(pa.array(missed)) if len(missed) < len(texts) else texts, timings)
            store.add(tagged(keys[missed], content.made if content is not None else None), fresh)
            source[missed], row[missed] = len(sources), np.arange(len(missed))
            sources.append(fresh)
        return sources, source, row

    def _serve(self, store: SegmentStore, todo: np.ndarray, keys: np.ndarray, sources: list[pa.LargeListArray],
               source: np.ndarray, row: np.ndarray) -> None:
        """Point texts `todo` (their cache `keys`) at the segments that hold them, checked key by key."""
        seg, at = store.find(keys)
        for number in np.unique(seg[seg >= 0]):
            rows = np.flatnonzero(seg == number)
            loaded = store.segment(int(number))
            if loaded is None:
                continue
            rows = rows[(loaded.keys[at[rows]] == keys[rows]).all(axis=1)]
            source[todo[rows]], row[todo[rows]] = len(sources), at[rows]
            sources.append(loaded.ids)
            self.stats.tokens_from_cache += int(np.diff(loaded.ids.offsets.to_numpy())[at[rows]].sum())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # what a failed run tokenized is still right: keep it

    def flush(self) -> EncodeStats:
        """Write the ids tokenized so far (a Ray worker after each chunk); the counts until now."""
        if self._store is not None:
            self._store.flush()
        return dataclasses.replace(self._sync())

    def close(self) -> None:
        """Write the run's new ids, keep the cache under its cap, log the run (once)."""
        root, space = self.root, self.space
        if root is None or space is None or self.closed:
            return
        self.closed = True
        self.flush()
        if getattr(self.tokenizer, "new_answers", False):
            answers = self.tokenizer.answers  # type: ignore[attr-defined]
            self.guard.attempt(root, lambda: fo.write_answers(space, answers, root))
        self.guard.attempt(root, lambda: fo.evict(root, self.limit))
        entry = {"time": round(time.time()), "namespace": space.name, "backend": getattr(self.tokenizer, "backend_used", None),
                 "tokenizer_seconds": round(self.stats.tokenizer_seconds, 3), **self.stats.to_json()}
        self.guard.attempt(root, lambda: fo.log_run(root, entry))

    def summary(self) -> dict[str, Any] | None:
        """The manifest's `token_cache`: where ids came from (None for a tokenizer without a cache key),
        with the backend that tokenized the texts not read from the cache (None: it tokenized none)."""
        if self.key is None:
            return None
        used = getattr(self.tokenizer, "backend_used", None)
        content = getattr(self.tokenizer, "content", None)
        reason = content.reason if content is not None and used == HF else None
        return {"dir": str(self.root) if self.root else None, **self._sync().to_json(),
                "backend": used, **({"backend_reason": reason} if reason else {})}

    def saving(self) -> dict[str, float]:
        """`--timings`' estimate of the seconds the cache saved: its tokens at the rate this run's
        backend measured, or, when this run tokenized (almost) nothing, at the rate the last logged
        run of this tokenizer measured with the backend this run would have used. Never at another
        backend's rate: gigatoken encodes ~40x faster than `tokenizers` (docs/design.md)."""
        if self.root is None or self.space is None or not self.stats.tokens_from_cache:
            return {}
        rate = self.stats.tokens_tokenized / self.stats.tokenizer_seconds if self.stats.tokenizer_seconds > 0.1 else 0
        if not rate:
            backend = self._backend()
            logged = [r for r in fo.runs(self.root) if r.get("namespace") == self.space.name
                      and r.get("backend") == backend and r.get("tokenizer_seconds", 0) > 0.1]
            rate = logged[-1]["tokens_tokenized"] / logged[-1]["tokenizer_seconds"] if logged and backend else 0
        return {SAVED: self.stats.tokens_from_cache / rate} if rate else {}

    def _backend(self) -> str | None:
        """The backend that encoded this run's texts, else the one it would have: `hf` when the run
        settled on it, else gigatoken (a tokenizer gigatoken cannot read has no gigatoken runs logged)."""
        used = getattr(self.tokenizer, "backend_used", None)
        content = getattr(self.tokenizer, "content", None)
        if used or content is None:
            return used
        return HF if content.requested == HF else GIGATOKEN


def gather(sources: list[pa.LargeListArray], source: np.ndarray, row: np.ndarray | None) -> pa.LargeListArray:
    """Row `row[i]` of `sources[source[i]]` for every i (`row` None: each source's rows in order).

    The ids move once, in numpy (`ragged.gather_pieces`): several times faster than pyarrow's
    `take` of list arrays (docs/design.md, Measured costs).
    """
    if len(sources) == 1 and (row is None or (len(row) == len(sources[0]) and (row == np.arange(len(row))).all())):
        return sources[0]
    assert row is not None
    assert all(s.type == pa.large_list(pa.int32()) for s in sources), [s.type for s in sources]
    offsets = [numbers_of(s.offsets, np.int64) for s in sources]
    flats = [numbers_of(s.values, np.int32)[o[0] : o[-1]] for s, o in zip(sources, offsets, strict=True)]
    starts, lengths = np.empty(len(row), np.int64), np.empty(len(row), np.int64)
    for number, o in enumerate(offsets):
        sel = np.flatnonzero(source == number)
        starts[sel], lengths[sel] = o[row[sel]] - o[0], o[row[sel] + 1] - o[row[sel]]
    out = np.zeros(len(row) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    return offsets_to_list_array(gather_pieces(flats, source, starts, lengths).astype(np.int32, copy=False), out)
