"""Part files of DST: numbered densely per folder, journaled before they exist, written on one
background thread, and recorded (rows, bytes, sha256) for the manifest; or staged, for a
mixture's second pass or a Ray driver's commit, under names their writer gives."""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa

from etl import columns as c
from etl.output.ownership import describe_file
from etl.output.parquet import write_part
from etl.output.writer import OutputWriter
from etl.safe_paths import check_no_symlink


class PartWriter:
    """Writes `DST/<folder>/part-NNNNN.parquet` files for one `OutputWriter`.

    Dense numbering means `data/train/part-00000.parquet` exists whenever the split has rows,
    whichever chunk they came from.
    """

    def __init__(self, output: OutputWriter | None, *, identity: Mapping[str, str]) -> None:
        self.output = output  # None: a Ray worker's `StagedParts` (the driver holds DST's writer)
        self.identity = dict(identity)  # stamped on every part (`etl.output.parquet.identity_keys`)
        self.parts: Counter[str] = Counter()
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []

    def count(self, folder: str) -> int:
        """Parts numbered so far in `folder`."""
        return self.parts[folder]

    def _next_path(self, folder: str) -> Path:
        """The next part's name (numbered here, on the caller's thread); `reserve` journals it
        where it is created: the journal's fsync (slow on a VM disk with parts being written:
        docs/design.md, Measured costs) then runs on the write thread, not in the pipeline's path."""
        assert self.output is not None
        number = self.parts[folder]
        self.parts[folder] += 1
        return self.output.root / folder / f"part-{number:05d}.parquet"

    @contextlib.contextmanager
    def background(self) -> Iterator[None]:
        """Write parts on one background thread while the next chunk is parsed and tokenized.

        pyarrow releases the GIL while it encodes and compresses, so the write of chunk k
        overlaps the work on chunk k+1. At most one write is pending (bounded memory); leaving
        the block waits for it and re-raises its error.
        """
        with ThreadPoolExecutor(max_workers=1) as pool:
            self._pool = pool
            try:
                yield
            finally:
                self._pool = None
                for future in self._pending:
                    future.result()
                self._pending.clear()

    def _write_now(self, folder: str, table: pa.Table, path: Path) -> None:
        assert self.output is not None
        try:
            write_part(table, self.output.reserve(path), identity=self.identity)
        except OSError as exc:
            if exc.filename is not None or exc.errno is None:
                raise
            # pyarrow's error names no file: the one line `etl` prints names the part (EFBIG: ulimit -f)
            raise OSError(exc.errno, os.strerror(exc.errno), str(path)) from exc
        self.output.add(path, rows=table.num_rows)

    def write(self, folder: str, table: pa.Table) -> None:
        """Write `table` as the next part of `folder`, in the background inside `background()`."""
        path = self._next_path(folder)
        if self._pool is None:
            self._write_now(folder, table, path)
            return
        while len(self._pending) > 1:  # keep memory bounded: wait for the older writes
            self._pending.pop(0).result()
        self._pending.append(self._pool.submit(self._write_now, folder, table, path))

    def place(self, folder: str, staged: Path, *, rows: int, sha256: str) -> None:
        """Rename a part written elsewhere (a Ray worker's, staged) into place as the next part of
        `folder`, and record it with the rows and sha256 its writer gave."""
        assert self.output is not None
        final = self.output.reserve(self._next_path(folder))
        final.parent.mkdir(parents=True, exist_ok=True)
        # the workers' own file, never a link: renaming one would make a link a part
        os.replace(check_no_symlink(staged, self.output.root), final)
        self.output.add(final, rows=rows, sha256=sha256)


class StagedParts(PartWriter):
    """Parts written under `staging/<prefix>/<folder>/`, unlisted, under names their writer gives.

    A mixture's first pass stages `data` and `turns` (prefix: the current source's name; the mix
    reads them back and writes the real parts) and writes rejects to their place as a plain run.
    A Ray worker has no `OutputWriter` (the driver holds DST's): it stages every part of its
    chunk (prefix: `<file>-<chunk>`), and `entries` describes each (rows, bytes, sha256) for the
    driver, which renames them into place (`PartWriter.place`).
    """

    STAGED = (c.DATA_DIR, c.TURNS_DIR)

    def __init__(self, output: OutputWriter | None, staging: Path, *, identity: Mapping[str, str],
                 prefix: str = "") -> None:
        super().__init__(output, identity=identity)
        self.staging, self.prefix = staging, prefix
        self.entries: list[dict[str, Any]] = []

    def _key(self, folder: str) -> str | None:
        """The key a staged folder's parts are numbered under; None for a folder written in place."""
        if self.output is not None and folder.split("/")[0] not in self.STAGED:
            return None
        return f"{self.prefix}/{folder}"

    def count(self, folder: str) -> int:
        key = self._key(folder)
        return self.parts[folder if key is None else key]

    def _next_path(self, folder: str) -> Path:
        key = self._key(folder)
        if key is None:
            return super()._next_path(folder)
        number = self.parts[key]
        self.parts[key] += 1
        return self.staging / key / f"part-{number:05d}.parquet"

    def _write_now(self, folder: str, table: pa.Table, path: Path) -> None:
        if self.staging not in path.parents:
            super()._write_now(folder, table, path)
            return
        write_part(table, path, identity=self.identity)
        if self.output is None:  # a Ray worker's part: the driver renames it into place
            self.entries.append({**describe_file(path, self.staging, rows=table.num_rows), "folder": folder})

    def staged(self, source: str, folder: str) -> list[Path]:
        """The staged parts of `source` in `folder` (e.g. data/train), in the order written."""
        key = f"{source}/{folder}"
        return [self.staging / key / f"part-{i:05d}.parquet" for i in range(self.parts[key])]

    def folders(self, source: str, kind: str) -> list[str]:
        """The folders (`data/train`, ...) of `kind` that `source` staged parts in, sorted."""
        prefix = f"{source}/{kind}/"
        return sorted(key[len(source) + 1:] for key in self.parts if key.startswith(prefix))
