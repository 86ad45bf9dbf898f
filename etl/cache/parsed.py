"""Parsed chunks kept across runs: a rerun over the same input with the same parse settings reads
DuckDB's output back instead of parsing the JSON again.

    <root>/parsed/<key>.<sha256>.arrow   `run_builder`'s table for one raw chunk (Arrow IPC, zstd)

The key is a digest of the raw chunk (its line numbers and bytes) and of all the parse depends on
besides: the builder's SQL and parameters, its record size limit, etl's and DuckDB's versions. A
template, mask, seq_len or mixture weight is not in it: those act after the parse. The file's own
sha256 is in its name, checked at every read: a damaged file is removed and the chunk parsed again.
A failed write (a full disk, a link below the cache root) turns the cache off for the run
(`etl.cache.guard`): every chunk is then parsed, as with --no-cache.

The parse was a large share of the CPU of a rerun whose every text is in the token cache; reading
the parsed chunks back costs a small part of it (T0, Qwen2.5: 65 MB of Arrow kept as 13 MB on disk
with zstd; the times: docs/design.md, Measured costs).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from pyarrow import ipc

from etl import __version__
from etl.cache import folder as fo
from etl.cache.folder import CacheSettings
from etl.cache.guard import CacheGuard, make_dir, remove, touch, write_file
from etl.formats.builders import BuilderQuery, run_builder, warn_unread
from etl.safe_paths import check_no_symlink
from etl.tokens.tokenizer import BYTES

# Bumped when what a file holds changes meaning: older files are then never read again.
FORMAT = "etl parsed chunk 1"
# zstd at its default level: a 16.8 MB T0 chunk is 2.4 MB (its write and read: docs/design.md,
# Measured costs).
OPTIONS = ipc.IpcWriteOptions(compression="zstd")


def chunk_key(raw: pa.Table, query: BuilderQuery) -> str:
    """The digest of one raw chunk and of everything its parse depends on (a builder's table is a
    function of these alone). Buffers are hashed whole with their slice bounds (docs/design.md,
    Measured costs)."""
    h = hashlib.sha256()
    settings = {"format": FORMAT, "etl": __version__, "duckdb": duckdb.__version__, "sql": query.sql,
                "params": query.params, "max_record_bytes": query.max_record_bytes, "schema": str(raw.schema)}
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    for column in raw.columns:
        for chunk in column.chunks:
            h.update(f"|{len(chunk)},{chunk.offset},{chunk.null_count}|".encode())
            for buf in chunk.buffers():
                h.update(b"-" if buf is None else f"{buf.size}:".encode())
                if buf is not None:
                    h.update(memoryview(buf))
    return h.hexdigest()[:40]


class ParsedChunks:
    """The parsed-chunk files of one cache root, used by one run's parsing thread."""

    def __init__(self, root: Path, guard: CacheGuard | None = None) -> None:
        self.root, self.folder = root, root / fo.PARSED_DIR
        self.guard = CacheGuard() if guard is None else guard
        # key -> file name; listed once (a file another run adds meanwhile is simply not used).
        self.names: dict[str, str] = self.guard.attempt(root, self._list) or {}
        self.hits = self.misses = self.damaged = 0

    def _list(self) -> dict[str, str]:
        make_dir(self.folder, self.root)
        return {p.name.split(".")[0]: p.name for p in self.folder.iterdir() if fo.PARSED_NAME.match(p.name)}

    def parse(self, con: duckdb.DuckDBPyConnection, raw: pa.Table, query: BuilderQuery) -> pa.Table:
        """`run_builder(con, raw, query)`, read back when an earlier run parsed the same chunk so."""
        key = chunk_key(raw, query)
        table = self._read(key)
        if table is not None:
            self.hits += 1
            warn_unread(con, raw, query)  # the warnings the parse gives, which the file does not keep
            return table
        self.misses += 1
        table = run_builder(con, raw, query)
        if not self.guard.off:
            self.guard.attempt(self.root, lambda: self._write(key, table))
        return table

    def _read(self, key: str) -> pa.Table | None:
        name = self.names.get(key)
        if name is None or self.guard.off:
            return None
        return self.guard.attempt(self.root, lambda: self._load(self.folder / name))

    def _load(self, path: Path) -> pa.Table | None:
        try:
            data = check_no_symlink(path, self.root).read_bytes()
        except FileNotFoundError:  # evicted by another run since the listing
            return None
        if hashlib.sha256(data).hexdigest() != path.name.split(".")[1]:
            self.damaged += 1
            print(f"etl run: warning: parsed chunk {path} is damaged (checksum); removed, parsing again",
                  file=sys.stderr)
            remove(path, self.root)
            return None
        touch(path, self.root)  # recently used: eviction takes the oldest first
        return ipc.open_file(pa.py_buffer(data)).read_all()

    def _write(self, key: str, table: pa.Table) -> None:
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, table.schema, options=OPTIONS) as writer:
            writer.write_table(table)
        data = sink.getvalue()
        name = f"{key}.{hashlib.sha256(data).hexdigest()}{fo.PARSED_SUFFIX}"
        write_file(self.folder / name, memoryview(data), self.root)
        self.names[key] = name

    def summary(self) -> dict[str, Any]:
        """The manifest's `token_cache.parsed_chunks`: chunks read back, parsed, found damaged."""
        return {"from_cache": self.hits, "parsed": self.misses, "damaged": self.damaged}


def open_parsed(cache: CacheSettings | None, tokenizer: str) -> ParsedChunks | None:
    """The run's parsed chunks: None without a token cache, or with the `bytes` tokenizer (which
    leaves the cache alone: nothing of its run is worth keeping)."""
    if cache is None or cache.root is None or tokenizer == BYTES:
        return None
    root = cache.root
    opened = cache.guard.attempt(root, lambda: fo.open_root(root))
    return None if opened is None else ParsedChunks(opened, cache.guard)
