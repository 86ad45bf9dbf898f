"""Find the input files of SRC (a file, a folder searched recursively, or a glob) as `Source`s.

A file's kind and compression come from its name (`classify`); hidden and underscore-prefixed
paths are skipped; each real file is read once (`etl.ingest.walk`); what is counted but not read
becomes a `Source` of kind `NOT_READ`, which the reader turns into an `UnreadableFile` with its
reason. `UnreadableFile` lives here too, below the reader and the decompressor that both raise it. SRC given as a URI is listed by `etl.ingest.objects` into
`Source`s whose path is an `ObjectPath`; this module only tells a URI from a path (`is_uri`).
"""

from __future__ import annotations

import errno
import glob
import os
import re
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from etl.errors import EtlError, EtlWarning
from etl.ingest.walk import (
    ALREADY_READ,
    SYMLINK_LOOP,
    UNREADABLE_DIR,
    hidden,
    identity,
    walk,
    walk_glob,
)

KINDS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet"}
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
# `scheme://` (RFC 3986: a letter, then letters, digits, + - .); two characters at least, so
# that a Windows drive (`C://x`) stays a path.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+://")


def is_uri(location: str) -> bool:
    """SRC or DST is a URI (`file://`, `s3://`, ...), resolved through pyarrow's filesystems."""
    return _SCHEME.match(location) is not None


class _ObjectStat(NamedTuple):
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

    def stat(self) -> _ObjectStat:
        return _ObjectStat(self.size)

    def absolute(self) -> ObjectPath:
        return self

    def resolve(self) -> ObjectPath:
        return self

    @property
    def parents(self) -> tuple[Path, ...]:
        return ()  # no local folder holds it (DST is one)

    def __str__(self) -> str:  # the object's URI, without SRC's options or a user:secret@ part
        return f"{self.root.split('://', 1)[0]}://{self.key}"


# Kind of a `Source` that is counted but not read: a folder that cannot be listed, a link not
# followed, an input-named entry that is not a regular file. It has no size (`Source.size`).
NOT_READ = "not_read"
UNREADABLE_FILE = "unreadable_file"
# Reasons of paths skipped because what they lead to is read under another path: nothing is lost,
# so they are not `incomplete_inputs` (and do not make the exit status 3).
READ_ELSEWHERE = (SYMLINK_LOOP, ALREADY_READ)
# Bytes read from each end of a local input for the run's identity (`Source.sample`): two 64 KiB
# reads a file, from the page cache the run then reads it from (docs/design.md, Measured costs).
SAMPLE_BYTES = 64 << 10


@dataclass(frozen=True)
class Source:
    """One input: its path, the name written to `source_file`, its kind and compression.

    Kind `NOT_READ` is an entry under SRC the run counts as one rejected record instead of
    reading it: `reason` is the reject reason (`unreadable_dir`, `symlink_loop`, `already_read`,
    `unreadable_file`), `error` says why.
    """

    path: Path | ObjectPath
    name: str
    kind: str
    compression: str | None
    error: str | None = None
    reason: str | None = None

    def size(self) -> int:
        """Bytes the engines will read (progress, Ray's blocks, the run's identity): 0 if `NOT_READ`."""
        return 0 if self.kind == NOT_READ else self.path.stat().st_size

    def not_read(self) -> UnreadableFile:
        """The exception a reader raises for a `NOT_READ` source, carrying its reason."""
        if self.reason in (None, UNREADABLE_DIR):
            return UnreadableDir(f"cannot list folder ({self.error})")
        exc = UnreadableFile(self.error)
        exc.reason = self.reason
        return exc


class UnreadableFile(Exception):
    """A whole file (or the rest of it) could not be parsed; the run records it and goes on."""

    reason = UNREADABLE_FILE


class UnreadableDir(UnreadableFile):
    """A folder under SRC could not be listed: whatever it holds is counted as one reject."""

    reason = UNREADABLE_DIR


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


def discover(src: str) -> list[Source]:
    """Input files of SRC (a file, a directory searched recursively, or a glob), sorted.

    Names are relative to SRC's directory (for a glob, its non-magic prefix directory), so
    a directory and a glob over it name files alike. A path with a hidden or underscore-
    prefixed part below that base (`.ipynb_checkpoints/`, `_old/`, `.x.jsonl`) is skipped.
    Each real file is read once, under its first name; what is counted but not read (a folder
    that cannot be listed, a symlink loop, a second path to a file or folder, an input-named
    entry that is not a regular file) is a `Source` of kind `NOT_READ`.
    """
    root = Path(src)
    if root.is_dir():
        if not os.access(root, os.R_OK | os.X_OK):
            raise EtlError(f"cannot read the input folder {root} (permission denied); check its permissions")
        (entries, skipped), base = walk(root), root
    elif root.is_file():
        (entries, skipped), base = ([root], []), root.parent
    else:  # a glob, or a path that is not a file or folder (a dangling link, a FIFO): counted
        (entries, skipped), base = walk_glob(src), _glob_base(src)
    sources = [_counted(s.path, _name(s.path, base) + ("/" if s.folder else ""), s.reason, s.why) for s in skipped]
    sources += _files(entries, base)
    if not sources:
        raise EtlError(
            f"no input files found at {src}; expected .jsonl, .json or .parquet files "
            "(optionally .gz or .zst), a directory holding them, or a glob"
        )
    for s in sources:
        if s.reason in READ_ELSEWHERE:
            warnings.warn(f"{s.name}: skipped, {s.error}; counted as rejected ({s.reason})", EtlWarning, stacklevel=2)
    return sorted(sources, key=lambda s: Path(s.name).parts)  # as Path sorting: by part


def _counted(path: Path, name: str, reason: str, why: str) -> Source:
    return Source(path=path, name=name, kind=NOT_READ, compression=None, error=why, reason=reason)


_FILE_TYPES = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
               stat.S_IFBLK: "a block device", stat.S_IFDIR: "a folder"}


def _files(paths: list[Path], base: Path) -> list[Source]:
    """The input-named paths as `Source`s, in name order. One that is not a regular file is
    counted (`unreadable_file`), never opened: a FIFO would block the read for ever; a second
    path to a file already found (a symlink, a hard link) is counted as `already_read`."""
    sources: list[Source] = []
    first: dict[tuple[int, int], str] = {}  # identity -> the name the file is read under
    for path in sorted(paths):
        kind = classify(path)
        name = _name(path, base)
        if kind is None or any(hidden(part) for part in Path(name).parts):
            continue
        try:
            st = os.stat(path)
        except OSError as exc:
            missing = exc.errno == errno.ENOENT and path.is_symlink()
            why = f"a dangling link: {os.path.realpath(path)} is missing" if missing else exc.strerror or str(exc)
            sources.append(_counted(path, name, UNREADABLE_FILE, why))
            continue
        if not stat.S_ISREG(st.st_mode):
            what = _FILE_TYPES.get(stat.S_IFMT(st.st_mode), "an unknown kind of file")
            sources.append(_counted(path, name, UNREADABLE_FILE, f"not a regular file but {what}"))
        elif (ident := identity(st)) in first:
            sources.append(_counted(path, name, ALREADY_READ, f"the same file as {first[ident]} (read once)"))
        else:
            first[ident] = name
            sources.append(Source(path=path, name=name, kind=kind[0], compression=kind[1]))
    return sources


def _name(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base))
    except ValueError:  # a glob match outside its prefix (`..`): name it as matched
        return str(path)
