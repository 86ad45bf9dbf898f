"""What etl owns in an output folder, and nothing else: the files its records and journal list.

A writer (`etl run` into DST, `etl export` into OUT, `etl pack` into DST) holds the folder's lock,
appends every path to `_journal.jsonl` before creating it, and at the end lists what it wrote
(path, rows, bytes, sha256) in its record: `_manifest.json` for a run, `_export.json` for an
export, `_packs.json` for a pack index. The next writer
removes exactly the files those lists (and an interrupted writer's journal) name, less a dataset
card the user edited since. `is_etl_output` and `owned_files` are the one predicate every writer
(`etl.output.writer.OutputWriter`) uses; a folder that is neither empty nor etl's is refused with
nothing touched.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from etl import columns as c
from etl.errors import EtlError

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
# bin/h5 export domain folder may take them (compared casefolded: macOS/Windows ignore case).
RESERVED = frozenset(
    n.casefold()
    for n in (c.DATA_DIR, c.TURNS_DIR, c.REJECTS_DIR, c.VAL_STORAGE_DIR, c.PACKS_DIR, *RECORDS.values(),
              *PROTOCOL_FILES, *EDITABLE, STAGING)
)
TMP_NAME = ".{}.tmp"  # the temporary name of a file being written (`tmp_of`)
# Manifests of format_version 1 listed data/turns parts only; their rejects parts were etl's too.
_V1_REJECTS = re.compile(re.escape(c.REJECTS_DIR) + r"/part-\d{5}\.parquet")


def read_record_file(path: Path) -> dict[str, Any] | None:
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
        record = read_record_file(folder / RECORDS[kind])
        owned |= record_paths(record)
        if record and kind == "run" and record.get("format_version") == 1:
            owned |= {str(p.relative_to(folder).as_posix()) for p in (folder / c.REJECTS_DIR).glob("*.parquet")
                      if _V1_REJECTS.fullmatch(p.relative_to(folder).as_posix())}
        if record:
            owned.add(RECORDS[kind])
    return owned


def edited_files(folder: Path, kinds: Iterable[str]) -> set[str]:
    """Editable files the records of `kinds` list whose bytes changed since: no longer etl's."""
    edited = set()
    for kind in kinds:
        for entry in (read_record_file(folder / RECORDS[kind]) or {}).get("files") or []:
            rel = entry.get("path") if isinstance(entry, dict) else None
            path = folder / rel if rel in EDITABLE else None
            if path is None or path.is_symlink():  # a link stays listed: the removal refuses it
                continue
            if path.is_file() and describe_file(path, folder, rows=None)["sha256"] != entry.get("sha256"):
                edited.add(rel)
    return edited


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_inputs(folder: Path, src_root: Path, *, storage: bool) -> bool:
    """Refuse an output folder that would mix with the inputs; True when SRC lies inside it.

    DST == SRC (or the folder of an input file) mixes the two and is refused. SRC inside DST
    (`etl run out/raw out/`) is fine while SRC's top folder is not one etl writes (and no bin/h5
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
        why = "a folder etl writes" if top.casefold() in RESERVED else "where bin/h5 domain folders go"
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
    digest = sha256_file(path)  # just written: read back from the page cache
    return {"path": path.relative_to(root).as_posix(), "rows": rows,
            "bytes": path.stat().st_size, "sha256": digest}


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file's bytes: the one content hash of etl's records (fast with SHA-NI:
    docs/design.md, Measured costs; hashlib releases the GIL, so threads hash in parallel)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def tmp_of(path: Path) -> Path:
    """The temporary name a file is written under before its rename (same folder, hidden)."""
    return path.with_name(TMP_NAME.format(path.name))
