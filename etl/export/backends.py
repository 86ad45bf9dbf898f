"""File backends of the bin/h5 export (`etl.export.token_files`), one per format (`bin`, `h5`).

A backend appends numpy chunks of whole sequences to a domain's shard k under temporary names,
then `finish` renames them (plain names when there is one shard); `etl.export.shards` decides
the shards and writes meta.json.
"""

from __future__ import annotations

import abc
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from etl import columns as c
from etl.errors import EtlError

if TYPE_CHECKING:
    from etl.output.writer import OutputWriter

META_FILE = "meta.json"
SEQUENCE = "sequence"
OFFSETS = "offsets"
H5_NAME = "data"
# Explicit little-endian: bin files are raw bytes, so their byte order must not depend on
# the machine that wrote them.
DTYPES = {
    SEQUENCE: np.dtype("<i8"),
    c.LOSS_MASK: np.dtype("<i8"),
    OFFSETS: np.dtype("<i8"),
    c.LOSS_WEIGHT: np.dtype("<f4"),
}
# 64 Ki elements = 512 KiB of int64 per h5 chunk: a few typical sequences, so a random read
# decompresses little, while gzip still sees enough data to compress well.
H5_CHUNK = 65_536


def _drop(tmp: Path) -> None:
    """Remove a temporary file of a failed export; a link in its place is the user's (the error
    that stopped the export names it)."""
    if not tmp.is_symlink():
        tmp.unlink(missing_ok=True)


def _shard_name(stem: str, k: int, n: int, ext: str) -> str:
    return f"{stem}.{ext}" if n == 1 else f"{stem}-{k:05d}.{ext}"


class Backend(abc.ABC):
    """Writes a domain's shards; `weights` says whether a ``loss_weight`` stream is written.

    Every file goes through ``output``: journaled before it is created, listed once renamed.
    """

    ext = ""

    def __init__(self, *, weights: bool, output: OutputWriter) -> None:
        self.weights, self.output = weights, output

    def _rename(self, tmp: Path, final: Path) -> None:
        os.replace(tmp, self.output.reserve(final))
        self.output.add(final)

    def streams(self) -> list[str]:
        """Names of the per-shard arrays, in file order."""
        return [SEQUENCE, c.LOSS_MASK, OFFSETS] + ([c.LOSS_WEIGHT] if self.weights else [])

    def tmp(self, folder: Path, k: int, stream: str) -> Path:
        """Temporary file of shard k's ``stream`` (hidden, so a half-written file is never used)."""
        return folder / f".{stream}-{k:05d}.{self.ext}.tmp"

    @abc.abstractmethod
    def open(self, folder: Path, k: int) -> None:
        """Start shard k empty (its offsets hold the leading 0)."""

    @abc.abstractmethod
    def append(self, folder: Path, k: int, arrays: dict[str, np.ndarray]) -> None:
        """Append one chunk of whole sequences (``offsets``: their end offsets) to shard k."""

    @abc.abstractmethod
    def finish(self, folder: Path, n: int) -> list[dict[str, str]]:
        """Rename the n shards to their final names; returns {stream: file} per shard."""

    def abort(self, folder: Path, n: int) -> None:
        """Remove the temporary files of a failed export (earlier finished files stay)."""
        for k in range(n):
            for stream in self.streams():
                _drop(self.tmp(folder, k, stream))


class _BinBackend(Backend):
    """``bin``: one raw file per stream and shard; appends are plain file appends."""

    ext = "bin"

    def open(self, folder: Path, k: int) -> None:
        for stream in self.streams():
            self.output.reserve(self.tmp(folder, k, stream)).write_bytes(b"")
        np.zeros(1, DTYPES[OFFSETS]).tofile(self.tmp(folder, k, OFFSETS))

    def append(self, folder: Path, k: int, arrays: dict[str, np.ndarray]) -> None:
        # Opened per append, not held: a run with thousands of domains would otherwise hold
        # 3-4 descriptors per domain; an open costs microseconds against a row group's I/O.
        for stream, arr in arrays.items():
            with open(self.tmp(folder, k, stream), "ab") as f:
                arr.astype(DTYPES[stream], copy=False).tofile(f)

    def finish(self, folder: Path, n: int) -> list[dict[str, str]]:
        files = []
        for k in range(n):
            names = {s: _shard_name(s, k, n, self.ext) for s in self.streams()}
            for stream, name in names.items():
                self._rename(self.tmp(folder, k, stream), folder / name)
            files.append(names)
        return files


def require_h5py() -> Any:
    try:
        import h5py  # optional dependency, imported only when h5 is asked for
    except ImportError as exc:
        raise EtlError("storage_format h5 needs h5py: pip install 'etl[h5]' (or h5py)") from exc
    return h5py


class _H5Backend(Backend):
    """``h5``: one HDF5 file per shard, datasets per stream, chunked, gzip + shuffle compressed.

    Trade-off against ``bin``: ~3-5x smaller for small ids (shuffle groups the zero high bytes),
    but reads decompress whole chunks and need h5py; ``bin`` is zero-copy.
    """

    ext = "h5"

    def tmp(self, folder: Path, k: int, stream: str = H5_NAME) -> Path:
        return folder / f".{H5_NAME}-{k:05d}.{self.ext}.tmp"

    def open(self, folder: Path, k: int) -> None:
        h5py = require_h5py()
        with h5py.File(self.output.reserve(self.tmp(folder, k)), "w") as f:
            for stream in self.streams():
                f.create_dataset(
                    stream,
                    shape=(1 if stream == OFFSETS else 0,),  # offsets start with their 0
                    maxshape=(None,),
                    dtype=DTYPES[stream],
                    chunks=(H5_CHUNK,),
                    compression="gzip",
                    compression_opts=1,  # level 1: most of the gain of 9 at a fraction of the time
                    shuffle=True,
                )

    def append(self, folder: Path, k: int, arrays: dict[str, np.ndarray]) -> None:
        with require_h5py().File(self.tmp(folder, k), "a") as f:
            for stream, arr in arrays.items():
                ds = f[stream]
                n = ds.shape[0]
                ds.resize((n + arr.shape[0],))
                ds[n:] = arr.astype(DTYPES[stream], copy=False)

    def finish(self, folder: Path, n: int) -> list[dict[str, str]]:
        files = []
        for k in range(n):
            name = _shard_name(H5_NAME, k, n, self.ext)
            self._rename(self.tmp(folder, k), folder / name)
            files.append({H5_NAME: name})
        return files

    def abort(self, folder: Path, n: int) -> None:
        for k in range(n):
            _drop(self.tmp(folder, k))


BACKENDS: dict[str, type[Backend]] = {"bin": _BinBackend, "h5": _H5Backend}
