"""`SegmentStore`: one run's view of a cache namespace: the key index, segments read and verified,
the run's new ids waiting to be written. State, hence a class; the algorithms are `index`'s.

Reads are lazy and checked: the index is built from the segments' keys alone at open (24 bytes a
text), and a segment's ids are read, checksummed and compared key by key the first time a chunk
needs them. Anything wrong with a segment (checksum, Parquet, removed by another run) makes its
texts misses: they are tokenized again and written anew, so the cache can never change an id.
Writes, removals and `utime`s go through `guard` (`etl.cache.guard`): a full disk or a link below
the cache root turns the cache off for the run instead of failing it.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pyarrow as pa

from etl.cache import index as ix
from etl.cache.folder import is_segment
from etl.cache.guard import CacheGuard, remove, touch
from etl.cache.segments import (
    IDS,
    KEY0,
    KEY1,
    CorruptSegment,
    as_ids,
    read_segment,
    segment_keys,
    write_segment,
)
from etl.errors import EtlWarning
from etl.safe_paths import check_no_symlink

# New ids held before they are written as one segment: 16M ids (64 MB), about T0's 55k chats.
FLUSH_IDS = 16 << 20
# Segments kept decoded after use: a run reading the cache in the order it was written needs
# one or two; more only help a run whose chunks hit many old segments.
LOADED_IDS = 64 << 20  # 256 MB


class _Loaded:
    """A segment's ids and keys in memory."""

    def __init__(self, ids: pa.LargeListArray, keys: np.ndarray) -> None:
        self.ids, self.keys = ids, keys


class SegmentStore:
    """The segments of one namespace folder, their index, and this run's unwritten ids."""

    def __init__(self, folder: Path, root: Path | None = None, guard: CacheGuard | None = None) -> None:
        """Raises SymlinkRefused when a segment is a link (the caller's guard turns the cache off)."""
        self.folder, self.root = folder, root or folder.parent
        self.guard = CacheGuard() if guard is None else guard
        self.paths: list[Path | None] = []  # segment number -> file (None: not written yet)
        self.loaded: OrderedDict[int, _Loaded] = OrderedDict()  # least recently used first
        self.pending: list[int] = []  # segment numbers of this run's unwritten ids
        self.bad: set[int] = set()
        self.written = self.corrupt = 0
        self.base = self._read_index()
        self.fresh = ix.empty()  # this run's ids: small, rebuilt as it grows

    def _read_index(self) -> ix.KeyIndex:
        keys, segs, rows = [np.zeros((0, 2), np.uint64)], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        for path in sorted(p for p in self.folder.iterdir() if is_segment(p)):
            check_no_symlink(path, self.root)  # read now, touched and maybe removed later
            try:
                k = segment_keys(path)
            except FileNotFoundError:
                continue
            except CorruptSegment as exc:
                self._drop(path, str(exc))
                continue
            segs.append(np.full(len(k), len(self.paths), np.int64))
            rows.append(np.arange(len(k), dtype=np.int64))
            keys.append(k)
            self.paths.append(path)
        return ix.build(np.concatenate(keys), np.concatenate(segs), np.concatenate(rows))

    def _drop(self, path: Path, why: str) -> None:
        self.corrupt += 1
        warnings.warn(f"token cache segment {path} is damaged ({why}): ignored and removed; its texts are "
                      "tokenized again", EtlWarning, stacklevel=2)
        self.guard.attempt(self.root, lambda: remove(path, self.root))

    def find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(segment, row) of each key, segment -1 where the cache does not hold it."""
        seg, row = np.full(len(keys), -1, np.int64), np.zeros(len(keys), np.int64)
        for index in (self.base, self.fresh):
            todo = np.flatnonzero(seg < 0)
            at = ix.find(index, keys[todo])
            hit = at != ix.MISSING
            if self.bad:  # a damaged or vanished segment's keys fall through to this run's ids
                hit[hit] = ~np.isin(index.seg[at[hit]], list(self.bad))
            seg[todo[hit]], row[todo[hit]] = index.seg[at[hit]], index.row[at[hit]]
        return seg, row

    def segment(self, number: int) -> _Loaded | None:
        """A segment's ids, read and verified on first use; None when it cannot be used."""
        if number in self.loaded:
            self.loaded.move_to_end(number)
            return self.loaded[number]
        path = self.paths[number]
        assert path is not None, "unwritten segments stay loaded"
        try:
            table = read_segment(path)
            self.guard.attempt(self.root, lambda: touch(path, self.root))  # eviction takes the oldest first
        except FileNotFoundError:  # another run evicted it
            self.bad.add(number)
            return None
        except CorruptSegment as exc:
            self.bad.add(number)
            self._drop(path, str(exc))
            return None
        keys = np.stack([table[KEY0].to_numpy(), table[KEY1].to_numpy()], axis=1)
        self._keep(number, _Loaded(as_ids(table[IDS]), keys))
        return self.loaded[number]

    def _keep(self, number: int, seg: _Loaded) -> None:
        self.loaded[number] = seg
        held = sum(len(s.ids.values) for s in self.loaded.values())
        for old in list(self.loaded):
            if held <= LOADED_IDS or old == number:
                break
            if old not in self.pending:
                held -= len(self.loaded.pop(old).ids.values)

    def add(self, keys: np.ndarray, ids: pa.LargeListArray) -> None:
        """This run's newly tokenized texts: found by later chunks now, written at FLUSH_IDS."""
        number = len(self.paths)
        self.paths.append(None)
        self.pending.append(number)
        self._keep(number, _Loaded(ids, keys))
        self.fresh = ix.extend(self.fresh, keys, np.full(len(keys), number, np.int64),
                               np.arange(len(keys), dtype=np.int64))
        if sum(len(self.loaded[n].ids.values) for n in self.pending) >= FLUSH_IDS:
            self.flush()

    def flush(self) -> None:
        """Write the unwritten ids as one segment; the index points at it from now on. When the
        write fails the cache is off (`guard`): the ids stay in memory, and no more are added."""
        if not self.pending or self.guard.off:
            return
        pieces = [self.loaded[n] for n in self.pending]
        keys = np.concatenate([p.keys for p in pieces])
        ids = pa.concat_arrays([p.ids for p in pieces])
        path = self.guard.attempt(self.root, lambda: write_segment(self.folder, keys, ids, self.root))
        if path is None:
            return
        for n in self.pending:
            del self.loaded[n]
        number = len(self.paths)
        self.paths.append(path)
        self.written += 1
        starts = np.cumsum([0] + [len(p.keys) for p in pieces])
        remap = np.full(number, -1, np.int64)
        remap[self.pending] = starts[:-1]
        moved = np.isin(self.fresh.seg, self.pending)
        row = np.where(moved, self.fresh.row + remap[np.where(moved, self.fresh.seg, 0)], self.fresh.row)
        self.fresh = self.fresh._replace(seg=np.where(moved, number, self.fresh.seg), row=row)
        self.pending = []
        self._keep(number, _Loaded(ids, keys))
