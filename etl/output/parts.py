"""Readers read exactly the parts the manifest lists, and check them before they trust them.

Every reader of DST (stats, report, inspect, export, `etl pack`, the loader) gets its files here:
each listed part must exist with the bytes and row count the manifest recorded (a footer read per
file, milliseconds), the run identity its footer carries, and its sha256 (a full read); a data part
must also agree with the manifest's facts (`etl.output.verify.check_rows`: S, kind, vocabulary). A
part on disk that the manifest does not list is ignored with a warning.

The sha256 is a full read of every part, on up to HASH_THREADS threads (hashlib releases the GIL;
more cores, more gain); its cost, measured with `python bench/verify_cost.py DST`, is in
docs/outputs.md. Each file's digest is kept per process by (device, inode, size, mtime, ctime), so
a loader, its val split, `etl pack` and stats's several queries in one process hash a part once.
Hashing happens at open, never per batch: DataLoader workers get the already-checked dataset.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import warnings
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from etl.columns import DATA_DIR, MANIFEST_FILE, MANIFEST_FILES_VERSION, RUN_ID
from etl.errors import EtlError, EtlWarning
from etl.output.manifest import read_manifest
from etl.output.ownership import sha256_file
from etl.output.parquet import RUN_ID_KEY, identity_keys, part_identity
from etl.output.verify import check_rows

RERUN = "rerun `etl run` to rewrite it"
# Threads hashing parts at once: 8 saturate a local NVMe and stay below what a network file system
# serves in parallel (the rates: docs/design.md, Measured costs).
HASH_THREADS = 8
_DIGESTS: dict[tuple[int, ...], str] = {}  # (dev, ino, size, mtime_ns, ctime_ns) -> sha256, this process's
_DIGESTS_LOCK = threading.Lock()


def _entries(manifest: dict[str, Any], dst: Path) -> list[dict[str, Any]]:
    files = manifest.get("files")
    if manifest.get("format_version", 1) < MANIFEST_FILES_VERSION or not isinstance(files, list):
        raise EtlError(
            f"{dst} was written by an older etl whose manifest does not list its files with "
            f"checksums; {RERUN}"
        )
    return files


def check_part(path: Path, entry: dict[str, Any], *, checksum: bool, identity: Mapping[str, str] | None,
               record: str = "the manifest", fix: str = RERUN) -> pq.FileMetaData | None:
    """Check one part against its record entry (bytes, rows, sha256) and its footer's identity.

    The one check every reader of DST's parts runs, the pack index's too (`record` names the
    record, `fix` the command that rewrites the part). `identity`: the `etl.output.parquet`
    key-value pairs the part must carry (None: a record written before run identities, not
    compared); they come from the footer that the row count reads anyway.

    Returns:
        The footer (None for an entry without rows: not Parquet).

    Raises:
        EtlError: one line naming the part and `fix`.
    """
    if not path.is_file():
        raise EtlError(f"{path} is listed in {record} but missing; {fix}")
    size, meta = path.stat().st_size, None
    if size != entry["bytes"]:
        raise EtlError(f"{path} has {size:,} bytes, {record} says {entry['bytes']:,}: it changed "
                       f"after etl wrote it; {fix}")
    if entry.get("rows") is not None:
        try:
            meta = pq.read_metadata(path)
        except (OSError, ValueError) as exc:
            raise EtlError(f"{path} is not a readable Parquet file ({exc}); {fix}") from exc
        if meta.num_rows != entry["rows"]:
            raise EtlError(f"{path} has {meta.num_rows:,} rows, {record} says {entry['rows']:,}; {fix}")
        found = part_identity(meta)
        if identity is not None and any(found.get(k) != v for k, v in identity.items()):
            raise EtlError(f"{path} was written by another etl run ({found.get(RUN_ID_KEY) or 'no run id'}), "
                           f"not the one {record} records ({identity[RUN_ID_KEY]}): it was replaced after "
                           f"etl wrote it; {fix}")
    if checksum:
        check_digest(path, entry, record=record, fix=fix)
    return meta


def _digest(path: Path) -> str:
    """The file's sha256, hashed once per process while its stat stays the same (a rewrite, even
    in place at the same size, changes mtime and ctime)."""
    st = path.stat()
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _DIGESTS_LOCK:
        known = _DIGESTS.get(key)
    if known is None:
        known = sha256_file(path)
        with _DIGESTS_LOCK:
            _DIGESTS[key] = known
    return known


def check_digest(path: Path, entry: dict[str, Any], *, record: str = "the manifest", fix: str = RERUN) -> None:
    """Refuse a part whose bytes are not the ones `record` lists (`entry["sha256"]`).

    Raises:
        EtlError: one line naming the part and `fix`.
    """
    if _digest(path) != entry.get("sha256"):
        raise EtlError(f"{path} does not match its sha256 in {record}: its content changed after etl "
                       f"wrote it, or it is another output's part; {fix}")


def _run_identity_of(manifest: dict[str, Any]) -> dict[str, str] | None:
    """The key-value pairs every part of this run carries; None for a manifest written before run
    identities (format_version 2 without `run_id`), whose parts are checked as before."""
    run_id = manifest.get(RUN_ID)
    return identity_keys(run_id) if isinstance(run_id, str) else None


def listed_parts(
    dst: str | os.PathLike[str],
    folder: str,
    *,
    manifest: dict[str, Any] | None = None,
    checksum: bool = True,
) -> list[Path]:
    """The Parquet parts the manifest lists directly in `folder` (e.g. `data/train`), checked.

    Args:
        dst: an `etl run` output.
        folder: a folder of DST, relative, with `/` separators.
        manifest: DST's manifest when the caller has read it already.
        checksum: compare each part's sha256 (reads it whole; once per process, on HASH_THREADS
            threads). Every reader does: False is for code that only lists, never reads, the parts.

    Returns:
        The parts in path order (the order the run wrote them).

    Raises:
        EtlError: a listed part is missing or differs from what the manifest recorded.
    """
    root = Path(dst)
    manifest = manifest if manifest is not None else read_manifest(root)
    prefix = folder.strip("/") + "/"
    chosen = [e for e in _entries(manifest, root)
              if e["path"].startswith(prefix) and "/" not in e["path"][len(prefix):]
              and e["path"].endswith(".parquet")]
    chosen.sort(key=lambda e: e["path"])
    identity = _run_identity_of(manifest)
    metas = [check_part(root / e["path"], e, checksum=False, identity=identity) for e in chosen]
    if checksum and chosen:
        with ThreadPoolExecutor(min(HASH_THREADS, len(chosen))) as pool:
            list(pool.map(lambda e: check_digest(root / e["path"], e), chosen))  # the first failure raises
    if prefix.startswith(DATA_DIR + "/"):  # after the sha256: the footers' stats are then etl's
        for entry, meta in zip(chosen, metas, strict=True):
            if meta is not None:
                check_rows(manifest, root / entry["path"], meta, root / MANIFEST_FILE)
    listed = {e["path"] for e in chosen}
    extra = sorted(p.relative_to(root).as_posix() for p in (root / folder).glob("*.parquet"))
    extra = [p for p in extra if p not in listed]
    if extra:
        warnings.warn(
            f"{root}: ignoring {len(extra)} Parquet file(s) the manifest does not list: "
            f"{', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''}",
            EtlWarning,
            stacklevel=2,
        )
    return [root / e["path"] for e in chosen]


def listed_splits(dst: str | os.PathLike[str], manifest: dict[str, Any] | None = None) -> list[str]:
    """Splits that have data parts in the manifest, sorted."""
    manifest = manifest if manifest is not None else read_manifest(dst)
    paths = [e["path"].split("/") for e in _entries(manifest, Path(dst))]
    return sorted({p[1] for p in paths if len(p) == 3 and p[0] == DATA_DIR})


def fingerprint(parts: list[Path], dst: str | os.PathLike[str], manifest: dict[str, Any]) -> str:
    """A short digest of exactly these parts as the manifest recorded them (path, rows, bytes,
    sha256): equal for a byte-identical rerun, different for any other data."""
    root = Path(dst)
    wanted = {p.relative_to(root).as_posix() for p in parts}
    entries = sorted((e for e in _entries(manifest, root) if e["path"] in wanted), key=lambda e: e["path"])
    text = json.dumps([[e["path"], e["rows"], e["bytes"], e["sha256"]] for e in entries])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def open_part(path: Path) -> pq.ParquetFile:
    """A Parquet file whose page checksums (CRC32) are verified as pages are read."""
    return pq.ParquetFile(path, page_checksum_verification=True)
