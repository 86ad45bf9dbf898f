"""SRC on a remote filesystem named by a URI (`s3://`, `gs://`, `hdfs://`, ...): list its input
files and open them for the reader, through pyarrow's filesystems.

The listing follows `etl.ingest.discover`: a file, or a folder (a key prefix) searched
recursively; the same kinds and compressions; hidden and underscore-prefixed names skipped;
names relative to SRC. Each `Source`'s path is an `ObjectPath` that carries SRC's URI, so a Ray
worker opens the file itself, resolving the filesystem once per process
(`etl.ingest.location.filesystem`). Globs are not expanded in URIs.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Self

from etl.errors import EtlError
from etl.ingest.discover import NOT_READ, SAMPLE_BYTES, ObjectPath, Source, classify, hidden
from etl.ingest.location import checks, display, failure, filesystem

if TYPE_CHECKING:
    import pyarrow.parquet as pq
    from pyarrow.fs import FileInfo, FileSystem

# Bytes per request when streaming a file: pyarrow's S3 and GCS input streams issue one ranged GET
# per read, and the reader asks for 64 KiB at a time from a compressed file (RAW_BLOCK), so
# unbuffered a 1 GB .gz would be ~16,000 requests, each a round trip to the store (docs/design.md,
# Measured costs); buffered, ~120.
STREAM_BUFFER = 8 << 20
COPY_BLOCK = 8 << 20  # bytes in memory at a time while copying a .json file to local disk


def _files(fs: FileSystem, base: str) -> tuple[list[FileInfo], str]:
    """The files at `base` (itself, or every file under it) and the folder names are relative to."""
    # pyarrow.fs: only for URI inputs
    from pyarrow.fs import FileSelector, FileType

    info = fs.get_file_info(base)
    if info.type == FileType.File:
        return [info], base.rpartition("/")[0]
    if info.type != FileType.Directory:
        return [], base
    listed = fs.get_file_info(FileSelector(base, recursive=True))
    return [i for i in listed if i.type == FileType.File], base


def discover_objects(src: str) -> list[Source]:
    """Input files of SRC, a URI of a file or a folder (prefix) searched recursively, sorted as
    `etl.ingest.discover.discover` sorts a local folder's.

    Raises:
        EtlError: SRC cannot be listed (credentials, endpoint), holds nothing, or no input files.
    """
    fs, base = filesystem(src)
    base = base.rstrip("/")
    try:
        files, root = _files(fs, base)
    except OSError as exc:
        raise failure("SRC", src, exc, doing="list it") from exc
    if not files:
        raise EtlError(f"SRC {display(src)}: no file or folder there (globs are not expanded in URIs); "
                       f"check {checks(src)}")
    sources = []
    for info in files:
        name = info.path[len(root):].lstrip("/") if root else info.path
        kind = classify(Path(name))
        if kind is None or any(hidden(part) for part in PurePosixPath(name).parts):
            continue
        path = ObjectPath(root=src, key=info.path, size=int(info.size or 0))
        sources.append(Source(path=path, name=name, kind=kind[0], compression=kind[1]))
    if not sources:
        raise EtlError(
            f"no input files found at {display(src)}; expected .jsonl, .json or .parquet files "
            "(optionally .gz or .zst), or a folder (key prefix) holding them"
        )
    return sorted(sources, key=lambda s: PurePosixPath(s.name).parts)


class _CountedStream:
    """pyarrow's buffered input stream with the `tell()` the progress bar reads (it has none)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._position = 0

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read() if n < 0 else self._stream.read(n)
        self._position += len(data)
        return data

    def tell(self) -> int:
        return self._position

    @property
    def closed(self) -> bool:
        return bool(self._stream.closed)

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_stream(path: ObjectPath) -> _CountedStream:
    """The file's bytes as a sequential stream (JSONL, and .gz/.zst, which etl decompresses itself
    so damage is reported as for local files: pyarrow's own decompression is turned off).

    Raises:
        EtlError: the file is gone or may not be read (the listing saw it: credentials, a race).
    """
    fs, _ = filesystem(path.root)
    try:
        stream = fs.open_input_stream(path.key, compression=None, buffer_size=STREAM_BUFFER)
    except OSError as exc:
        raise failure("SRC file", str(path), exc, doing="open it") from exc
    return _CountedStream(stream)


def ends(path: ObjectPath, size: int) -> bytes | None:
    """The object's first and last `size` bytes (whole when smaller): two range requests
    (`Source.sample`), None when it cannot be read now (the run reports that when it reads it)."""
    fs, _ = filesystem(path.root)
    try:
        with fs.open_input_file(path.key) as f:
            head = f.read(size)
            f.seek(max(path.size - size, len(head)))
            return head + f.read(size)
    except OSError:
        return None


def sample(source: Source) -> str | None:
    """sha256 of the input's first and last SAMPLE_BYTES (whole when smaller): with its size,
    what the run's identity knows of its content, so that runs over same-named, same-size
    inputs that differ near an end (or anywhere, below 128 KiB) stamp different identities.
    A change in the middle of a larger file is caught by the parts' sha256, not here. None
    for a `NOT_READ` entry or an input that cannot be read now (the run reports it when it reads
    it); an object store input costs two range requests, so it stamps what a local copy does."""
    if source.kind == NOT_READ:
        return None
    if isinstance(source.path, ObjectPath):
        data = ends(source.path, SAMPLE_BYTES)
    else:
        try:
            with open(source.path, "rb") as f:
                head = f.read(SAMPLE_BYTES)
                f.seek(max(f.seek(0, os.SEEK_END) - SAMPLE_BYTES, len(head)))
                data = head + f.read(SAMPLE_BYTES)
        except OSError:
            data = None
    return None if data is None else hashlib.sha256(data).hexdigest()


def parquet_file(path: ObjectPath) -> pq.ParquetFile:
    """A Parquet file read by ranges (`open_input_file`); `pre_buffer` merges a row group's
    column-chunk reads into a few large requests, as pyarrow advises for high-latency stores."""
    import pyarrow.parquet as pq  # pyarrow: only for URI Parquet inputs

    fs, _ = filesystem(path.root)
    try:
        handle = fs.open_input_file(path.key)
    except OSError as exc:
        raise failure("SRC file", str(path), exc, doing="open it") from exc
    return pq.ParquetFile(handle, pre_buffer=True)


@contextmanager
def local_copy(path: ObjectPath) -> Iterator[Path]:
    """The file copied to a temporary local file (TMPDIR), deleted on exit.

    For .json arrays and pretty-printed JSON, which DuckDB's `read_json_objects` parses from a
    local path only (its httpfs extension is a download at run time, with credentials of its own).
    Costs the (compressed) file's size on local disk, one file at a time per reader, and
    COPY_BLOCK of memory; the copy keeps the name's last suffixes so DuckDB sees the compression.
    """
    suffix = "".join(PurePosixPath(path.key).suffixes[-2:])
    fd, tmp = tempfile.mkstemp(prefix="etl-src-", suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as out, open_stream(path) as stream:
            while block := stream.read(COPY_BLOCK):
                out.write(block)
        yield Path(tmp)
    finally:
        os.unlink(tmp)
