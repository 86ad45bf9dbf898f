"""The token cache is an optimisation: when writing it fails, the run goes on without it.

A full disk (ENOSPC), a quota (EDQUOT), a permission or any other OSError while the cache is
written, or a symlink below its root (`etl.safe_paths`), turns the cache off for the rest of the
run with one warning naming its folder; the output is what --no-cache writes. Every write and
delete below the root goes through the helpers here: they check the path from the root down
(one `lstat` per component: docs/design.md, Measured costs), open files with O_NOFOLLOW, write to
a temporary name renamed into place when whole, and remove that temporary file when the write fails.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from etl.errors import EtlWarning
from etl.safe_paths import SymlinkRefused, check_no_symlink, open_nofollow

T = TypeVar("T")
TMP_PREFIX = ".tmp-"  # files being written: renamed into place when whole


class CacheGuard:
    """Whether this run still uses the token cache; the first failed write turns it off.

    One per run (shared by the parsing thread's `ParsedChunks` and the `Encoder`, through
    `CacheSettings`), so a full disk gives one warning. A Ray worker gets a fresh one: its cache
    is its own node's folder.
    """

    def __init__(self) -> None:
        self.off = False
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[type[CacheGuard], tuple[()]]:
        return CacheGuard, ()  # a lock does not pickle, and a worker's disk is not the driver's

    def attempt(self, root: Path, work: Callable[[], T]) -> T | None:
        """`work()`, or None once the cache is off or when it fails writing the cache at `root`."""
        if self.off:
            return None
        try:
            return work()
        except (OSError, SymlinkRefused) as exc:
            self.fail(root, exc)
            return None

    def fail(self, root: Path, exc: OSError | SymlinkRefused) -> None:
        with self._lock:
            if self.off:
                return
            self.off = True
        warnings.warn(message(root, exc), EtlWarning, stacklevel=3)


def message(root: Path, exc: OSError | SymlinkRefused) -> str:
    """One line: the cache's folder, what failed, that the run goes on, and what to do."""
    goes_on = "the run goes on without it (the output is the same)"
    if isinstance(exc, SymlinkRefused):
        return f"token cache {root} is not used: {exc}; {goes_on}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        why = "is full (no space left on device)" if exc.errno == errno.ENOSPC else "is over its disk quota"
        return (f"token cache {root} {why}: {goes_on}; free space there, or pass another --cache DIR "
                "(or $ETL_CACHE_DIR), or --no-cache")
    where = f": {exc.filename}" if exc.filename else ""
    return (f"token cache {root} cannot be written ({exc.strerror or exc}{where}): {goes_on}; pass another "
            "--cache DIR (or $ETL_CACHE_DIR), or --no-cache")


def write_file(path: Path, data: bytes | memoryview, root: Path) -> None:
    """Write `path` whole or not at all: a temporary file beside it, renamed into place.

    Raises:
        SymlinkRefused: `path` or a folder above it (below `root`) is a symlink.
        OSError: the write failed (the temporary file is removed).
    """
    check_no_symlink(path, root)  # the final name too: a link there would be replaced, not written through
    tmp = path.with_name(f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}-{path.name}")
    fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, root)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # our own new name (O_EXCL): never a link, never another's file
        raise


def append_line(path: Path, line: str, root: Path) -> int:
    """Append one line (a single write: whole beside another run's); the file's size after it.
    A failed write is cut off again, so no half line stays behind."""
    data = line.encode()
    fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, root)
    try:
        before = os.fstat(fd).st_size
        try:
            if os.write(fd, data) < len(data):  # a nearly full disk takes part of it
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        except OSError:
            with contextlib.suppress(OSError):  # the log is statistics: a half line would spoil the next
                os.ftruncate(fd, before)
            raise
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def make_dir(folder: Path, root: Path) -> Path:
    """`folder` (below `root`), made when missing; never a link."""
    check_no_symlink(folder, root)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def remove(path: Path, root: Path) -> None:
    """Delete `path` (below `root`) unless it or a folder above it is a link; gone already is fine."""
    check_no_symlink(path, root)
    path.unlink(missing_ok=True)


def touch(path: Path, root: Path) -> None:
    """Mark `path` recently used (eviction takes the oldest first); never the target of a link."""
    check_no_symlink(path, root)
    os.utime(path)
