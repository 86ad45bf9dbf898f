"""What etl owns in an output folder, and nothing else: the files its records and journal list.

A writer (`etl run` into DST, `etl export` into OUT, `etl pack` into DST) holds the folder's lock,
appends every path to `_journal.jsonl` before creating it, and at the end lists what it wrote
(path, rows, bytes, sha256) in its record: `_manifest.json` for a run, `_export.json` for an
export, `_packs.json` for a pack index. The next writer
removes exactly the files those lists (and an interrupted writer's journal) name, less a dataset
card the user edited since. `is_etl_output`
and `owned_files` are the one predicate every writer uses; a folder that is neither empty nor
etl's is refused with nothing touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Self

from etl import columns as c
from etl.errors import EtlError, EtlWarning
from etl.output.lock import FolderLock

RECORDS = {"run": c.MANIFEST_FILE, "export": c.EXPORT_FILE, "pack": c.PACKS_FILE}
# A run replaces everything etl wrote in the folder (an export or a pack index of the old data is
# stale with it); an export replaces only the previous export, so `etl export DST DST` keeps the
# run; `etl pack` replaces only the previous pack index.
REPLACES = {"run": ("run", "export", "pack"), "export": ("export",), "pack": ("pack",)}
PROTOCOL_FILES = {c.LOCK_FILE, c.JOURNAL_FILE}
# The one folder etl owns whole: `--engine ray` workers write into it, on any node, after the driver
# journaled it and before it renames their parts into place; a rerun removes it with what it holds.
STAGING = c.STAGING_DIR
# Files a user may take over by editing them (the dataset card): a writer removes one only while it
# holds the bytes its record lists (a sha256 of a few KB); once edited it is the user's.
EDITABLE = frozenset({c.CARD_FILE})
# Top-level names of an output folder that etl writes: no input may lie under them, and no
# seed-004 domain folder may take them (compared casefolded: macOS/Windows ignore case).
RESERVED = frozenset(
    n.casefold()
    for n in (c.DATA_DIR, c.TURNS_DIR, c.REJECTS_DIR, c.VAL_STORAGE_DIR, c.PACKS_DIR, *RECORDS.values(),
              *PROTOCOL_FILES, *EDITABLE, STAGING)
)
# Manifests of format_version 1 listed data/turns parts only; their rejects parts were etl's too.
_V1_REJECTS = re.compile(re.escape(c.REJECTS_DIR) + r"/part-\d{5}\.parquet")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise EtlError(f"{path} is unreadable ({exc}); it is etl's record of what it wrote there: "
                       "restore it, or remove the folder yourself") from exc
    return value if isinstance(value, dict) else None


def _safe(rel: Any) -> bool:
    """A listed path etl may act on: relative, below the folder (a damaged or hostile record
    must not make a rerun delete `../../x`)."""
    if not isinstance(rel, str) or not rel or "\\" in rel:
        return False
    parts = rel.split("/")
    return not rel.startswith("/") and ".." not in parts and "" not in parts and ":" not in parts[0]


def record_paths(record: dict[str, Any] | None) -> set[str]:
    """The relative paths a manifest or export record lists (both entry shapes)."""
    if not record:
        return set()
    files = record.get("files") or []
    paths = {f if isinstance(f, str) else f.get("path") for f in files if isinstance(f, (str, dict))}
    return {p for p in paths if _safe(p)}


def _journal_paths(folder: Path) -> set[str]:
    """Paths an interrupted writer was about to create (a torn last line is skipped)."""
    try:
        lines = (folder / c.JOURNAL_FILE).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return set()
    paths = set()
    for line in lines:
        try:
            paths.add(json.loads(line)["path"])
        except (ValueError, KeyError, TypeError):
            continue
    return {p for p in paths if _safe(p)}


def is_etl_output(folder: Path) -> bool:
    """Whether etl wrote this folder: it holds a run manifest, an export record or a journal."""
    return any((folder / name).is_file() for name in (*RECORDS.values(), c.JOURNAL_FILE))


def owned_files(folder: Path, kinds: Iterable[str] = RECORDS) -> set[str]:
    """Relative paths etl wrote in `folder` per the records of `kinds`, plus the journal's."""
    owned = _journal_paths(folder)
    for kind in kinds:
        record = _read_json(folder / RECORDS[kind])
        owned |= record_paths(record)
        if record and kind == "run" and record.get("format_version") == 1:
            owned |= {str(p.relative_to(folder).as_posix()) for p in (folder / c.REJECTS_DIR).glob("*.parquet")
                      if _V1_REJECTS.fullmatch(p.relative_to(folder).as_posix())}
        if record:
            owned.add(RECORDS[kind])
    return owned


def _edited(folder: Path, kinds: Iterable[str]) -> set[str]:
    """Editable files the records of `kinds` list whose bytes changed since: no longer etl's."""
    edited = set()
    for kind in kinds:
        for entry in (_read_json(folder / RECORDS[kind]) or {}).get("files") or []:
            rel = entry.get("path") if isinstance(entry, dict) else None
            path = folder / rel if rel in EDITABLE else None
            if path and path.is_file() and describe_file(path, folder, rows=None)["sha256"] != entry.get("sha256"):
                edited.add(rel)
    return edited


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_inputs(folder: Path, src_root: Path, *, storage: bool) -> bool:
    """Refuse an output folder that would mix with the inputs; True when SRC lies inside it.

    DST == SRC (or the folder of an input file) mixes the two and is refused. SRC inside DST
    (`etl run out/raw out/`) is fine while SRC's top folder is not one etl writes (and no seed-004
    domain folders are written into DST). DST inside SRC is fine: the caller skips DST's files.
    """
    dst, root = folder.resolve(), src_root.resolve()
    if dst == root:
        raise EtlError(
            f"DST {folder} is also the input folder (SRC {src_root}): etl would mix its output with "
            "your files and read its own parts back; write into another folder"
        )
    if not _inside(root, dst):
        return False
    top = root.relative_to(dst).parts[0]
    if top.casefold() in RESERVED or storage:
        why = "a folder etl writes" if top.casefold() in RESERVED else "where seed-004 domain folders go"
        raise EtlError(
            f"the input {src_root} lies inside {folder}/{top}, {why}; move the input out of {folder}"
        )
    return True


def check_target(folder: Path, *, keep: Iterable[Path] = ()) -> None:
    """Refuse a folder etl may not write: a file, or non-empty and not an etl output.

    `keep` are entries the caller knows are the inputs (SRC inside DST); they do not count.
    """
    if folder.exists() and not folder.is_dir():
        raise EtlError(f"{folder} is a file; pass a folder (it is created if missing)")
    if not folder.is_dir() or is_etl_output(folder):
        return
    keep = {k.resolve() for k in keep}
    foreign = sorted(p.name for p in folder.iterdir()
                     if p.name not in PROTOCOL_FILES and p.resolve() not in keep)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise EtlError(
            f"{folder} is not empty ({shown}) and is not an etl output (no {c.MANIFEST_FILE}); "
            "etl writes only into a new or empty folder or its own earlier output: pick another folder"
        )


def describe_file(path: Path, root: Path, *, rows: int | None) -> dict[str, Any]:
    """A record entry: relative path, rows (Parquet), bytes and sha256 of the file as written."""
    with open(path, "rb") as f:  # just written: read back from the page cache, ~1 GB/s
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return {"path": path.relative_to(root).as_posix(), "rows": rows,
            "bytes": path.stat().st_size, "sha256": digest}


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
        self._files: list[dict[str, Any]] = []
        self._reserved: set[str] = set()
        self._mutex = threading.Lock()  # parts are added from the background write thread

    def __enter__(self) -> Self:
        check_target(self.root, keep=self.keep)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            if (self.root / c.JOURNAL_FILE).is_file():
                warnings.warn(f"{self.root}: removing what an interrupted etl writer left", EtlWarning,
                              stacklevel=2)
            kinds = REPLACES[self.kind]
            owned = owned_files(self.root, kinds) - _edited(self.root, kinds)
            self._journal = open(self.root / c.JOURNAL_FILE, "a", encoding="utf-8")
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
                if exc_type is None:
                    (self.root / c.JOURNAL_FILE).unlink(missing_ok=True)
        finally:
            self._lock.release()

    def _journal_lines(self, rels: Iterable[str]) -> None:
        self._journal.write("".join(json.dumps({"path": rel}) + "\n" for rel in rels))
        self._journal.flush()
        os.fsync(self._journal.fileno())  # on disk before the files exist: ~1 ms per call

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
        record = _read_json(path)
        if record is None:
            raise EtlError(f"{path} is missing: {self.root} holds no finished etl {kind} output")
        if value is None and key not in record:
            return
        if value is None:
            del record[key]
        else:
            record[key] = value
        _write_json(path, record)


def _write_json(path: Path, body: dict[str, Any]) -> None:
    """A record written under its temp name, then renamed: a reader sees the old or the new one."""
    tmp = tmp_of(path)
    tmp.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def tmp_of(path: Path) -> Path:
    """The temporary name a file is written under before its rename (same folder, hidden)."""
    return path.with_name(f".{path.name}.tmp")


def _prune_empty(path: Path, root: Path) -> None:
    """Remove the folders above a deleted file that it left empty, up to (not including) root."""
    for parent in path.parents:
        if parent == root or root not in parent.parents:
            return
        try:
            parent.rmdir()
        except OSError:  # not empty (a user's file, another part) or already gone
            return
