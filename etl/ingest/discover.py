"""Find the input files of SRC (a file, a folder searched recursively, or a glob) as `Source`s.

A file's kind and compression come from its name (`classify`); hidden and underscore-prefixed
paths are skipped; a folder that cannot be listed becomes a `Source` of kind `dir`, which the
reader turns into `UnreadableDir`. `UnreadableFile` lives here too, below the reader and the
decompressor that both raise it. SRC given as a URI is listed by `etl.ingest.objects` into
`Source`s whose path is an `ObjectPath`; this module only tells a URI from a path (`is_uri`).
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from etl.errors import EtlError

KINDS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet"}
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
# `scheme://` (RFC 3986: a letter, then letters, digits, + - .); two characters at least, so
# that a Windows drive (`C://x`) stays a path.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+://")


def is_uri(location: str) -> bool:
    """SRC or DST is a URI (`file://`, `s3://`, ...), resolved through pyarrow's filesystems."""
    return _SCHEME.match(location) is not None


class ObjectStat(NamedTuple):
    """What `os.stat_result` the engines read of an input: its size."""

    st_size: int


@dataclass(frozen=True)
class ObjectPath:
    """An input file in a filesystem named by a URI (`s3://`, `gs://`, ...).

    It carries SRC's URI, not a filesystem object, so a `Source` pickles to Ray workers and each
    worker opens the file with its own credentials (`etl.ingest.objects`). It answers the few
    `Path` calls the engines make on a source (`stat().st_size`, `absolute()`, `resolve()`)
    from the listing, without a request; it has no `__fspath__`, so nothing opens it as a local file.
    """

    root: str  # SRC as given: the URI whose filesystem holds `key`, with its options
    key: str  # the file's path in that filesystem (`bucket/prefix/a.jsonl`)
    size: int  # bytes, from the listing

    def stat(self) -> ObjectStat:
        return ObjectStat(self.size)

    def absolute(self) -> ObjectPath:
        return self

    def resolve(self) -> ObjectPath:
        return self

    @property
    def parents(self) -> tuple[Path, ...]:
        return ()  # no local folder holds it (DST is one)

    def __str__(self) -> str:  # the object's URI, without SRC's options or a user:secret@ part
        return f"{self.root.split('://', 1)[0]}://{self.key}"


@dataclass(frozen=True)
class Source:
    """One input: its path, the name written to `source_file`, its kind and compression.

    Kind `dir` is a folder under SRC that could not be listed (`error` says why): the run counts
    it as a rejected record (`unreadable_dir`) instead of skipping what it holds unseen.
    """

    path: Path | ObjectPath
    name: str
    kind: str
    compression: str | None
    error: str | None = None


class UnreadableFile(Exception):
    """A whole file (or the rest of it) could not be parsed; the run records it and goes on."""

    reason = "unreadable_file"


class UnreadableDir(UnreadableFile):
    """A folder under SRC could not be listed: whatever it holds is counted as one reject."""

    reason = "unreadable_dir"


def classify(path: Path) -> tuple[str, str | None] | None:
    """(kind, compression) from the file name, or None for files that are not input."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = COMPRESSIONS.get(suffixes[-1]) if suffixes else None
    if compression:
        suffixes = suffixes[:-1]
    kind = KINDS.get(suffixes[-1]) if suffixes else None
    return (kind, compression) if kind else None


def _glob_base(pattern: str) -> Path:
    """The directory a glob's matches are named relative to: its leading non-magic parts."""
    parts = Path(pattern).parts
    fixed = []
    for part in parts[:-1]:
        if glob.has_magic(part):
            break
        fixed.append(part)
    return Path(*fixed) if fixed else Path(".")


def source_root(src: str) -> Path:
    """The folder SRC's files are named relative to: SRC itself, a file's folder, a glob's base."""
    root = Path(src)
    if root.is_dir():
        return root
    return root.parent if root.is_file() else _glob_base(src)


def hidden(part: str) -> bool:
    """A hidden or underscore-prefixed name (`.ipynb_checkpoints`, `_old`): not input."""
    return part.startswith((".", "_")) and part not in (".", "..")


def _walk(root: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Files under root (symlinked folders followed, as `rglob` did) and the folders that could
    not be listed, with why. Hidden and underscore-prefixed folders are not entered."""
    if not os.access(root, os.R_OK | os.X_OK):
        raise EtlError(f"cannot read the input folder {root} (permission denied); check its permissions")
    files: list[Path] = []
    unreadable: list[tuple[Path, str]] = []

    def failed(exc: OSError) -> None:
        unreadable.append((Path(exc.filename or root), exc.strerror or str(exc)))

    for folder, dirs, names in os.walk(root, onerror=failed, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not hidden(d))
        files += [Path(folder) / n for n in names if (Path(folder) / n).is_file()]
    return files, unreadable


def discover(src: str) -> list[Source]:
    """Input files of SRC (a file, a directory searched recursively, or a glob), sorted.

    Names are relative to SRC's directory (for a glob, its non-magic prefix directory), so
    a directory and a glob over it name files alike. A path with a hidden or underscore-
    prefixed part below that base (`.ipynb_checkpoints/`, `_old/`, `.x.jsonl`) is skipped.
    A folder under a directory SRC that cannot be listed is a `Source` of kind `dir`.
    """
    root = Path(src)
    unreadable: list[tuple[Path, str]] = []
    if root.is_file():
        candidates, base = [root], root.parent
    elif root.is_dir():
        (candidates, unreadable), base = _walk(root), root
    else:
        base = _glob_base(src)
        candidates = [Path(p) for p in glob.glob(src, recursive=True) if Path(p).is_file()]
    sources = [Source(path=p, name=_name(p, base) + "/", kind="dir", compression=None, error=why)
               for p, why in unreadable]
    for path in sorted(candidates):
        kind = classify(path)
        if kind is None:
            continue
        name = _name(path, base)
        if any(hidden(part) for part in Path(name).parts):
            continue
        sources.append(Source(path=path, name=name, kind=kind[0], compression=kind[1]))
    if not sources:
        raise EtlError(
            f"no input files found at {src}; expected .jsonl, .json or .parquet files "
            "(optionally .gz or .zst), a directory holding them, or a glob"
        )
    return sorted(sources, key=lambda s: Path(s.name).parts)  # as Path sorting: by part


def _name(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base))
    except ValueError:  # a glob match outside its prefix (`..`): name it as matched
        return str(path)
