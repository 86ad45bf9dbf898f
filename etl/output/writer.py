"""The one writer of an output folder (`OutputWriter`): lock, journal, removal of the previous
output, file records; what it may touch is `etl.output.ownership`'s to say.

Every path goes through `reserve` before it is created (journaled, checked for symlinks from the
root down) and `add` once complete; `commit` writes the record last.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Self

from etl import columns as c
from etl.errors import EtlError, EtlWarning
from etl.output.lock import FolderLock
from etl.output.ownership import (
    RECORDS,
    REPLACES,
    STAGING,
    TMP_NAME,
    check_target,
    describe_file,
    edited_files,
    owned_files,
    read_record_file,
    tmp_of,
)
from etl.output.verify import seal
from etl.safe_paths import check_no_symlink, open_nofollow


class OutputWriter:
    """The one writer of a folder: lock, journal, removal of the previous output, file records.

    Use as a context manager; `reserve` every path before creating it, `add` it once complete,
    and `commit` the record last. On an error the journal stays, so the next writer removes
    whatever this one left.
    """

    def __init__(self, root: Path, *, kind: str, keep: Iterable[Path] = ()) -> None:
        self.root, self.kind, self.keep = root, kind, list(keep)
        self._lock = FolderLock(root)
        self._journal: Any = None
        self._made = self._listed = False  # whether this writer made the folder, journaled the old output
        self._files: list[dict[str, Any]] = []
        self._reserved: set[str] = set()
        self._mutex = threading.Lock()  # parts are added from the background write thread

    def __enter__(self) -> Self:
        check_target(self.root, keep=self.keep)
        self._made = not self.root.exists()  # removed again by a failed run that wrote nothing
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            kinds = REPLACES[self.kind]
            self._check([c.JOURNAL_FILE, *(RECORDS[k] for k in kinds)])  # before they are read
            if (self.root / c.JOURNAL_FILE).is_file():
                warnings.warn(f"{self.root}: removing what an interrupted etl writer left", EtlWarning,
                              stacklevel=2)
            owned = owned_files(self.root, kinds) - edited_files(self.root, kinds)
            self._check(owned)  # every link refused before the first file goes
            fd = open_nofollow(self.root / c.JOURNAL_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, self.root)
            self._journal = os.fdopen(fd, "a", encoding="utf-8")
            self._listed = bool(owned)
            self._journal_lines(owned)  # a kill while removing leaves them listed, never orphaned
            self._remove(owned)
        except BaseException:
            self._lock.release()
            raise
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        try:
            if self._journal is not None:
                self._journal.close()
                # an error before the first path was journaled leaves nothing for the next run to remove
                if exc_type is None or not (self._listed or self._reserved):
                    (self.root / c.JOURNAL_FILE).unlink(missing_ok=True)
        finally:
            self._lock.release()
        if exc_type is not None and self._made and not (self._listed or self._reserved):
            with contextlib.suppress(OSError):  # not empty: another process wrote there meanwhile
                self.root.rmdir()

    def _journal_lines(self, rels: Iterable[str]) -> None:
        self._journal.write("".join(json.dumps({"path": rel}) + "\n" for rel in rels))
        self._journal.flush()
        # On disk before the files exist (an fsync per call: docs/design.md, Measured costs).
        os.fsync(self._journal.fileno())

    def _check(self, rels: Iterable[str]) -> None:
        """Refuse a path to write or delete (or its temp name) that is or lies below a link: it
        would write or delete the link's target, or replace the link the user put there. Parts
        share a few folders, each checked once (docs/outputs.md gives the cost)."""
        folders: set[str] = set()
        for rel in rels:
            folder, _, name = rel.rpartition("/")
            if folder not in folders:
                folders.add(folder)
                check_no_symlink(self.root / folder, self.root)
            for leaf in (name, TMP_NAME.format(name)):
                if os.path.islink(os.path.join(self.root, folder, leaf)):
                    check_no_symlink(self.root / folder / leaf, self.root)  # raises, naming it

    def _remove(self, owned: set[str]) -> None:
        """Delete what the previous writer listed: its record first (never looks finished)."""
        records = [RECORDS[k] for k in REPLACES[self.kind]]
        for rel in sorted(owned, key=lambda r: (r not in records, r)):
            for path in (self.root / rel, tmp_of(self.root / rel)):
                if path.is_file() or path.is_symlink():
                    path.unlink()
                elif rel == STAGING and path.is_dir():
                    shutil.rmtree(path)
            _prune_empty(self.root / rel, self.root)

    def reserve(self, path: Path) -> Path:
        """Journal `path` (and its temp name) before it is created; refuse to overwrite a file
        etl did not write."""
        rel = path.relative_to(self.root).as_posix()
        with self._mutex:
            if rel in self._reserved:
                return path
            self._check([rel])  # its folders are created (parents=True) and it is written next
            if path.exists():
                raise EtlError(self._in_the_way(path, rel))
            self._journal_lines([rel])
            self._reserved.add(rel)
        return path

    def _in_the_way(self, path: Path, rel: str) -> str:
        kept = [k for k in RECORDS if k not in REPLACES[self.kind]]
        if rel in owned_files(self.root, kept):
            return (f"{path} belongs to the etl {', '.join(kept)} output in {self.root}, which this "
                    f"{self.kind} does not replace; write into another folder")
        return f"{path} exists and was not written by etl; move it away and rerun"

    def add(self, path: Path, *, rows: int | None = None, sha256: str | None = None) -> None:
        """Record a complete file (it must have been reserved); `sha256`, when the writer that made
        it (a Ray worker) computed it already, is trusted instead of read back."""
        if sha256 is None:
            entry = describe_file(path, self.root, rows=rows)
        else:
            entry = {"path": path.relative_to(self.root).as_posix(), "rows": rows,
                     "bytes": path.stat().st_size, "sha256": sha256}
        assert entry["path"] in self._reserved, f"{path} written without reserve()"
        with self._mutex:
            self._files.append(entry)

    def staging(self) -> Path:
        """The staging folder (`STAGING`), journaled, then created empty: helpers of this writer on
        other machines write there; a rerun after a crash removes it whole."""
        path = self.reserve(self.root / STAGING)
        path.mkdir()
        return path

    def files(self) -> list[dict[str, Any]]:
        """Entries of every file added, sorted by path."""
        return sorted(self._files, key=lambda f: f["path"])

    def commit(self, record: dict[str, Any]) -> Path:
        """Write the record (manifest / export record) with the file list, atomically, last."""
        path = self.reserve(self.root / RECORDS[self.kind])
        _write_json(path, {**record, "files": self.files()})
        return path

    def amend(self, kind: str, key: str, value: Any) -> None:
        """Set one top-level `key` of another writer's record (None removes it), atomically.

        For summaries one writer copies into another's record (`etl pack`'s utilization in the run
        manifest); the record's `files` are never touched, so what it owns does not change. Only
        inside the `with` block: the lock keeps two writers from amending at once.

        Raises:
            EtlError: the record is missing (the folder holds no finished output of `kind`).
        """
        assert self._journal is not None, "amend() outside the writer's `with` block"
        assert key != "files", "amend() never changes what a record owns"
        path = self.root / RECORDS[kind]
        record = read_record_file(path)
        if record is None:
            raise EtlError(f"{path} is missing: {self.root} holds no finished etl {kind} output")
        if value is None and key not in record:
            return
        self._check([RECORDS[kind]])
        if value is None:
            del record[key]
        else:
            record[key] = value
        _write_json(path, record)


def _write_json(path: Path, body: dict[str, Any]) -> None:
    """A record written under its temp name, then renamed: a reader sees the old or the new one.
    Sealed with its own checksum (`etl.output.verify.seal`), recomputed by every `amend`."""
    tmp = tmp_of(path)
    tmp.write_text(json.dumps(seal(body), indent=2, sort_keys=True, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _prune_empty(path: Path, root: Path) -> None:
    """Remove the folders above a deleted file that it left empty, up to (not including) root."""
    for parent in path.parents:
        if parent == root or root not in parent.parents:
            return
        try:
            parent.rmdir()
        except OSError:  # not empty (a user's file, another part) or already gone
            return
