"""A progress bar over input bytes that also shows records and tokens per second (tqdm, stderr)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self


class Progress:
    """Bytes of input done (by whole files, as compressed sizes are all we know up front).

    tqdm turns itself off when stderr is not a terminal, so logs and tests stay clean.
    """

    def __init__(self, *, total_bytes: int, enabled: bool = True) -> None:
        self._bar: Any = _NoBar()
        if enabled and sys.stderr.isatty():  # tqdm's own rule (disable=None), without importing it:
            # tqdm (~90 modules; its import: docs/design.md, Measured costs): only when a bar is shown
            from tqdm import tqdm

            self._bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="etl run", dynamic_ncols=True)
        self._started = time.perf_counter()
        self._done_files = 0
        self._in_file = 0

    def update(self, records: int, tokens: int) -> None:
        """Refresh the records and tokens/s figures after a chunk."""
        elapsed = max(time.perf_counter() - self._started, 1e-9)
        self._bar.set_postfix_str(f"{records:,} rec, {tokens / elapsed / 1e6:.2f}M tok/s", refresh=True)

    def file_done(self, size: int) -> None:
        """Mark a whole file as read (what file_position did not report yet)."""
        self.file_position(size)
        self._done_files += size
        self._in_file = 0

    def file_position(self, position: int) -> None:
        """Bytes of the current file read so far (compressed bytes for .gz/.zst)."""
        if position > self._in_file:
            self._bar.update(position - self._in_file)
            self._in_file = position

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._bar.close()


class _NoBar:
    """The bar of a run that shows none (--quiet, or stderr not a terminal)."""

    def update(self, n: int) -> None:
        return None

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        return None

    def close(self) -> None:
        return None


def rows_bar(files: list[Path], *, desc: str, enabled: bool = True) -> Any:
    """A tqdm bar over the rows of Parquet files (total from their footers; off when not a TTY,
    or not `enabled`: `etl run --quiet`'s export stage).

    For commands that stream row groups (`etl export`): call `.update(table.num_rows)`.
    """
    # pyarrow.parquet: only for the export bars
    import pyarrow.parquet as pq
    from tqdm import tqdm

    total = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    return tqdm(total=total, unit="rows", unit_scale=True, disable=None if enabled else True, desc=desc,
                dynamic_ncols=True)
