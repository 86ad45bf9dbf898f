"""The bin/h5 export: per-domain int64 token files (`bin`, mmap-able) or HDF5 (`h5`).

`write_bin` / `write_h5` stream one split of `DST/data/<split>/part-*.parquet`, row group by row
group, into `OUT/<domain>/`; `read_bin` memory-maps a shard back. Layout of a domain folder:

    meta.json        written last (a folder without it is unfinished); keys below
    sequence.bin     bin: token ids, raw little-endian int64, all sequences back to back
    loss_mask.bin    bin: 0/1 per token, little-endian int64, aligned with sequence.bin
    offsets.bin      bin: N + 1 little-endian int64; sequence i is sequence[offsets[i]:offsets[i+1]]
    loss_weight.bin  bin: float32 per token, only when the Parquet data has `loss_weight`
    data.h5          h5: datasets `sequence`, `loss_mask`, `offsets` (int64) [, `loss_weight`]

A domain over `max_tokens_per_shard` tokens gets numbered shards instead (`sequence-00000.bin`,
`loss_mask-00000.bin`, `offsets-00000.bin`, ... or `data-00000.h5`); each shard is self-contained
(its offsets start at 0) and a sequence is never split across shards. A sequence longer than the
limit gets a shard of its own, so only a one-sequence shard can exceed the limit.

meta.json keys:
    format, format_version   "bin" | "h5"; 1
    domain                   the `domain` value, `__default__` for null or "" (the folder name is it, with `/ \\ % : * ? " < > |`,
                             control characters and names clashing with DST's own folders
                             %XX-escaped; see `domain_folder`)
    split                    the Parquet split exported (the layout itself has no splits)
    num_sequences, num_tokens, num_trained   totals over all shards (num_trained: mask == 1)
    max_tokens_per_shard     the limit the shards were cut at
    sequence, loss_mask      {"shape": [num_tokens], "dtype": "int64", "byteorder": "little"}
    offsets                  {"shape": [num_sequences + number of shards], "dtype": "int64", ...}
    loss_weight              {"shape": [num_tokens], "dtype": "float32", ...}; only with weights
    shards                   list, in sequence order, of {files: {stream: file name} (bin) or
                             {"data": "data.h5"} (h5), num_sequences, num_tokens, num_trained,
                             first_sequence, first_token (global index of its first sequence/token)}
    source                   the run: dst, seq_len, pad_id, eot_id, bos_ids, eos_ids, tokenizer,
                             template (from DST/_manifest.json)

Sequence order is the order of the rows of the split's part files (file, then row) in that domain.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow.parquet as pq

from etl import columns as c
from etl.errors import EtlError
from etl.export.backends import BACKENDS, META_FILE, OFFSETS, SEQUENCE, require_h5py
from etl.export.shards import domain_folder, write_domains
from etl.output.manifest import read_manifest
from etl.output.parts import listed_parts, listed_splits
from etl.output.writer import OutputWriter

__all__ = [
    "domain_folder", "export_storage", "memmap_file", "read_bin", "read_meta", "write_bin", "write_h5",
]

DEFAULT_MAX_TOKENS_PER_SHARD = c.DEFAULT_MAX_TOKENS_PER_SHARD  # 800 MB of int64 per stream file
FORMAT_VERSION = 1


def _source(dst: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    keys = ("seq_len", "pad_id", "eot_id", "bos_ids", "eos_ids", "tokenizer", "template")
    return {"dst": str(dst.resolve()), **{k: manifest.get(k) for k in keys}}


def check_options(storage_format: str, max_tokens_per_shard: int) -> None:
    if storage_format not in BACKENDS:
        raise EtlError(f"storage format {storage_format!r} unknown; use one of {sorted(BACKENDS)}")
    if max_tokens_per_shard < 1:
        raise EtlError(f"max_tokens_per_shard must be >= 1, got {max_tokens_per_shard}")
    if storage_format == "h5":  # a missing h5py fails before OUT is claimed, not at the first shard
        require_h5py()


def write_split(
    parts: list[Path],
    out: Path,
    *,
    output: OutputWriter,
    storage_format: str,
    split: str,
    max_tokens_per_shard: int,
    source: dict[str, Any],
    dst: Path,
    progress: bool = True,
) -> dict[str, dict[str, int]]:
    """Write the given Parquet parts of one split as per-domain folders under ``out``; every
    file goes through ``output`` (journaled, then listed in its record). See `export_storage`."""
    weights = any(c.LOSS_WEIGHT in pq.read_schema(f).names for f in parts)
    backend = BACKENDS[storage_format](weights=weights, output=output)
    writers = write_domains(parts, out, backend=backend, limit=max_tokens_per_shard, progress=progress)
    head = {
        "format": storage_format,
        "format_version": FORMAT_VERSION,
        "domain": None,  # set per domain below; placed here so meta.json reads in this order
        "split": split,
        "max_tokens_per_shard": max_tokens_per_shard,
        "source": _source(dst, source),
    }
    return {d: w.finish({**head, "domain": d}) for d, w in writers.items()}


def export_storage(
    dst: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    storage_format: str,
    split: str = "train",
    max_tokens_per_shard: int = DEFAULT_MAX_TOKENS_PER_SHARD,
) -> dict[str, dict[str, int]]:
    """Write one split of an ``etl run`` output as per-domain ``bin`` or ``h5`` token files.

    OUT is claimed like DST by a run: new, empty or an earlier etl output; locked while the
    export writes; the previous export's files (listed in ``OUT/_export.json``) are replaced and
    nothing else is touched.

    Args:
        dst: ``etl run`` output directory (needs ``_manifest.json`` and ``data/<split>/``).
        out: directory to write ``<domain>/`` folders into; may be ``dst`` itself.
        storage_format: ``"bin"`` or ``"h5"``.
        split: Parquet split to export.
        max_tokens_per_shard: tokens per shard before a new one starts (>= 1).

    Returns:
        ``{domain: {"sequences", "tokens", "trained", "shards"}}`` for every domain written.

    Raises:
        EtlError: bad format or limit, ``dst`` not a finished run, the split missing, a part
            that differs from the manifest, OUT not etl's, or two domains whose folder names
            differ only in case.
    """
    check_options(storage_format, max_tokens_per_shard)
    dst, out = Path(dst), Path(out)
    manifest = read_manifest(dst)
    parts = listed_parts(dst, f"{c.DATA_DIR}/{split}", manifest=manifest, checksum=True)
    if not parts:
        raise EtlError(f"no Parquet files in {dst / c.DATA_DIR / split}; pick a split from "
                       f"{listed_splits(dst, manifest)}")
    with OutputWriter(out, kind="export") as output:
        counts = write_split(parts, out, output=output, storage_format=storage_format, split=split,
                               max_tokens_per_shard=max_tokens_per_shard, source=manifest, dst=dst)
        output.commit({"format": storage_format, "source": str(dst.resolve()), "split": split,
                       "domains": counts})
    return counts


def write_bin(
    dst: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    max_tokens_per_shard: int = DEFAULT_MAX_TOKENS_PER_SHARD,
    split: str = "train",
) -> dict[str, dict[str, int]]:
    """The ``bin`` export: ``out/<domain>/{meta.json, sequence.bin, loss_mask.bin, offsets.bin}``.

    Files are raw little-endian int64, readable zero-copy with ``numpy.memmap`` (or `read_bin`).

    Args:
        dst: ``etl run`` output directory.
        out: directory for the ``<domain>/`` folders; ``dst`` itself is fine.
        max_tokens_per_shard: tokens per shard before a new one starts.
        split: Parquet split to export.

    Returns:
        ``{domain: {"sequences", "tokens", "trained", "shards"}}``.

    Raises:
        EtlError: as `export_storage`.
    """
    return export_storage(
        dst, out, storage_format="bin", split=split, max_tokens_per_shard=max_tokens_per_shard
    )


def write_h5(
    dst: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    split: str = "train",
    max_tokens_per_shard: int = DEFAULT_MAX_TOKENS_PER_SHARD,
) -> dict[str, dict[str, int]]:
    """The ``h5`` export: ``out/<domain>/{meta.json, data.h5}`` (needs h5py: ``pip install etl[h5]``).

    Datasets ``sequence``, ``loss_mask``, ``offsets`` (int64), chunked and gzip-compressed.

    Args:
        dst: ``etl run`` output directory.
        out: directory for the ``<domain>/`` folders; ``dst`` itself is fine.
        split: Parquet split to export.
        max_tokens_per_shard: tokens per shard file before a new one starts.

    Returns:
        ``{domain: {"sequences", "tokens", "trained", "shards"}}``.

    Raises:
        EtlError: as `export_storage`, or h5py missing.
    """
    return export_storage(
        dst, out, storage_format="h5", split=split, max_tokens_per_shard=max_tokens_per_shard
    )


def read_meta(domain_dir: str | os.PathLike[str], *, required: bool = True) -> dict[str, Any]:
    """Load ``meta.json`` of a folder `etl export` wrote (a storage domain or an episode dataset).

    Args:
        domain_dir: the folder holding ``meta.json``.
        required: False returns ``{}`` when the file is absent (an episode layout written by
            other tools has none).

    Raises:
        EtlError: required and absent; the message says how to create it.
    """
    path = Path(domain_dir) / META_FILE
    if not path.is_file():
        if not required:
            return {}
        raise EtlError(f"{path} not found: create it with `etl export DST OUT --format bin|h5`")
    return json.loads(path.read_text(encoding="utf-8"))


def memmap_file(path: Path, dtype: npt.DTypeLike, count: int | None = None) -> np.ndarray:
    """A read-only memmap of a flat file of `dtype` items (pages are read only when touched).

    Args:
        path: the file.
        dtype: its item type.
        count: the items meta.json says it holds: a missing or other-sized file is a broken
            export. None: as many as the file holds.

    Raises:
        EtlError: the file does not hold `count` items.
    """
    if count is not None:
        size = path.stat().st_size if path.is_file() else -1
        if size != count * np.dtype(dtype).itemsize:
            raise EtlError(f"{path} is missing or has {size} bytes, not {count} x {dtype}; re-export")
    if path.stat().st_size == 0:  # np.memmap refuses empty files; an empty split is valid
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def read_bin(
    domain_dir: str | os.PathLike[str], *, shard: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Memory-map one shard of a ``bin`` domain folder (pages are read only when touched).

    Args:
        domain_dir: ``OUT/<domain>`` as written by `write_bin`.
        shard: shard to open; None is allowed only when the domain has a single shard.

    Returns:
        ``(sequence, loss_mask, offsets)``: int64 memmaps of the shard's tokens and mask, and its
        offsets (num_sequences + 1, from 0): sequence i is ``sequence[offsets[i]:offsets[i+1]]``.

    Raises:
        EtlError: not a ``bin`` folder, bad shard number, or files that do not match meta.json.
    """
    d = Path(domain_dir)
    meta = read_meta(d)
    if meta.get("format") != "bin":
        raise EtlError(f"{d} holds format {meta.get('format')!r}, not bin; open it with h5py")
    shards = meta["shards"]
    if shard is None and len(shards) != 1:
        raise EtlError(f"{d} has {len(shards)} shards; pass shard=0..{len(shards) - 1}")
    k = 0 if shard is None else shard
    if not 0 <= k < len(shards):
        raise EtlError(f"{d} has shards 0..{len(shards) - 1}, not {k}")
    entry = shards[k]
    files = entry["files"]
    sequence = memmap_file(d / files[SEQUENCE], "<i8", entry["num_tokens"])
    mask = memmap_file(d / files[c.LOSS_MASK], "<i8", entry["num_tokens"])
    offsets = np.array(memmap_file(d / files[OFFSETS], "<i8", entry["num_sequences"] + 1))
    return sequence, mask, offsets
