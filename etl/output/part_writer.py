"""Part files of DST: numbered densely per folder, journaled before they exist, written on one
background thread, and recorded (rows, bytes, sha256) for the manifest."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa

from etl import columns as c
from etl.output.parquet import write_part
from etl.output.writer import OutputWriter


class PartWriter:
    """Writes `DST/<folder>/part-NNNNN.parquet` files for one `OutputWriter`.

    Dense numbering means `data/train/part-00000.parquet` exists whenever the split has rows,
    whichever chunk they came from.
    """

    def __init__(self, output: OutputWriter, *, identity: Mapping[str, str]) -> None:
        self.output = output
        self.identity = dict(identity)  # stamped on every part (`etl.output.parquet.identity_keys`)
        self.parts: Counter[str] = Counter()
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []

    def count(self, folder: str) -> int:
        """Parts numbered so far in `folder`."""
        return self.parts[folder]

    def _next_path(self, folder: str) -> Path:
        number = self.parts[folder]
        self.parts[folder] += 1
        return self.output.reserve(self.output.root / folder / f"part-{number:05d}.parquet")

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

    def _write_now(self, table: pa.Table, path: Path) -> None:
        write_part(table, path, identity=self.identity)
        self.output.add(path, rows=table.num_rows)

    def write(self, folder: str, table: pa.Table) -> None:
        """Write `table` as the next part of `folder`, in the background inside `background()`."""
        path = self._next_path(folder)
        if self._pool is None:
            self._write_now(table, path)
            return
        while len(self._pending) > 1:  # keep memory bounded: wait for the older writes
            self._pending.pop(0).result()
        self._pending.append(self._pool.submit(self._write_now, table, path))


class StagedParts(PartWriter):
    """The first pass of a mixture: `data` and `turns` parts go to the staging folder, under the
    current `source`'s name, unlisted (etl.pipeline.mixture reads them back, mixes them and
    writes the real parts); rejects go to their place as in a plain run."""

    STAGED = (c.DATA_DIR, c.TURNS_DIR)

    def __init__(self, output: OutputWriter, staging: Path, *, identity: Mapping[str, str]) -> None:
        super().__init__(output, identity=identity)
        self.staging = staging
        self.source = ""

    def _next_path(self, folder: str) -> Path:
        if folder.split("/")[0] not in self.STAGED:
            return super()._next_path(folder)
        key = f"{self.source}/{folder}"
        number = self.parts[key]
        self.parts[key] += 1
        return self.staging / key / f"part-{number:05d}.parquet"

    def _write_now(self, table: pa.Table, path: Path) -> None:
        if self.staging in path.parents:
            write_part(table, path, identity=self.identity)
        else:
            super()._write_now(table, path)

    def staged(self, source: str, folder: str) -> list[Path]:
        """The staged parts of `source` in `folder` (e.g. data/train), in the order written."""
        key = f"{source}/{folder}"
        return [self.staging / key / f"part-{i:05d}.parquet" for i in range(self.parts[key])]

    def folders(self, source: str, kind: str) -> list[str]:
        """The folders (`data/train`, ...) of `kind` that `source` staged parts in, sorted."""
        prefix = f"{source}/{kind}/"
        return sorted(key[len(source) + 1:] for key in self.parts if key.startswith(prefix))
