"""One writer at a time: an exclusive `flock` on `<folder>/_lock`, released by the kernel on death.

A killed run leaves the file but not the lock, so the next writer takes it over without guessing
from pids or clocks. The file carries who holds it (pid, host, command, start) for the error a
second writer sees. It is removed on release; a writer that locked a file another process has
just removed (it checks the inode after locking) starts over, so two writers never both hold it.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
from pathlib import Path
from typing import Self

from etl.columns import LOCK_FILE
from etl.errors import EtlError
from etl.safe_paths import open_nofollow

ATTEMPTS = 5  # lock races lost to a concurrent release before giving up (each costs microseconds)


def _holder() -> str:
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    command = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:200]
    return json.dumps(
        {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "started": started}
    )


def _describe(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        return f"pid {info['pid']} on {info['host']}, `{info['command']}`, since {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` itself (not a link's target) is the file open as `fd`."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (found.st_dev, found.st_ino) == (mine.st_dev, mine.st_ino)


class FolderLock:
    """An exclusive lock on a folder for one writer (a context manager; state: the open file)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise an `EtlError` naming the process that holds it."""
        try:
            import fcntl
        except ImportError as exc:  # Windows: no flock; etl's writers need Linux or macOS
            raise EtlError("etl needs fcntl file locks (Linux or macOS) to guard its output") from exc
        for _ in range(ATTEMPTS):
            fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT, self.path.parent)  # a link: refused
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise EtlError(
                    f"{self.path.parent} is being written by {_describe(self.path)}; wait for it "
                    "to finish or write somewhere else (one writer at a time)"
                ) from None
            if _same_file(fd, self.path):
                os.ftruncate(fd, 0)
                os.write(fd, _holder().encode())
                self._fd = fd
                return
            os.close(fd)  # the holder removed the file as we locked it: lock the new one
        raise EtlError(f"could not lock {self.path}: it keeps being replaced; is another etl running?")

    def release(self) -> None:
        """Remove the file, then drop the lock (in that order: see the module docstring). A file
        put in its place meanwhile (not the one locked) is left alone."""
        if self._fd is None:
            return
        try:
            if _same_file(self._fd, self.path):
                self.path.unlink()
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
