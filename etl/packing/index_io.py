"""Write and read `DST/packs/<split>/part-*.parquet`, the pack index, under etl's writer protocol.

`etl pack` is an `OutputWriter` of kind "pack": it replaces only the previous pack index and records
what it wrote in `_packs.json` (its identity and the data run's, per split: strategy, S, seed,
options, counts, utilization and the fingerprint of the data it was built from): the one record
readers trust. The run manifest's `packs` key is a copy derived from it, removed before the old
index and written after the record, so a crash leaves it absent, never stale. A new `etl run`
removes both. Every reader gets the index's parts from `pack_files`, which trusts them only while
the fingerprint matches the split's data parts and each part matches the record (bytes, rows,
identity, sha256).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from etl import __version__
from etl import columns as c
from etl.errors import EtlError
from etl.output.manifest import read_manifest
from etl.output.ownership import record_paths
from etl.output.parquet import identity_keys, identity_of
from etl.output.part_writer import PartWriter
from etl.output.parts import check_part, fingerprint, open_part
from etl.output.verify import check_seal
from etl.output.writer import OutputWriter
from etl.packing.index import PACKS_SCHEMA, PackIndex, index_packing, index_table, split_parts

PACKS_FORMAT_VERSION = 2  # 2: the record carries its checksum (etl.output.verify)
# Packs per part file: ~256k packs of ~8 pieces each is ~2M pieces, ~20 MB of Parquet, so a
# split of 1M examples stays one or two files and a reader never holds more than one part twice.
PACKS_PER_PART = 1 << 18
REPACK = "rerun `etl pack`"


def write_pack_index(dst: str | os.PathLike[str], indexes: Mapping[str, PackIndex]) -> dict[str, Any]:
    """Replace DST's pack index with `indexes` (split -> index); returns the `_packs.json` record.

    Holds DST's lock throughout: the previous index goes first, then each split's parts (each
    carrying the pack's identity and the data run's), the record last. An index built from data
    that changed since (another `etl run` meanwhile) is refused.

    Raises:
        EtlError: DST is not a finished `etl run` output, an index is stale, or a file of the
            user's lies where a part goes (it is never overwritten).
    """
    root = Path(dst)
    read_manifest(root)  # not an etl run output: one clear line, nothing touched
    with OutputWriter(root, kind="pack") as output:
        output.amend("run", c.MANIFEST_PACKS, None)  # its index is gone: so is its copy
        manifest = read_manifest(root)
        for split, index in indexes.items():
            current = fingerprint(split_parts(root, split, manifest), root, manifest)
            if current != index.fingerprint:
                raise EtlError(f"the data of split {split!r} in {root} changed while it was packed; {REPACK}")
        data_run_id = manifest.get(c.RUN_ID)
        run_id = _pack_identity(indexes, data_run_id)
        parts = PartWriter(output, identity=identity_keys(run_id, data_run_id=data_run_id))
        summaries = {}
        for split in sorted(indexes):
            table = index_table(indexes[split])
            for start in range(0, table.num_rows, PACKS_PER_PART):
                parts.write(f"{c.PACKS_DIR}/{split}", table.slice(start, PACKS_PER_PART))
            summaries[split] = indexes[split].summary()
        record = {"format_version": PACKS_FORMAT_VERSION, c.RUN_ID: run_id, c.DATA_RUN_ID: data_run_id,
                  "splits": summaries}
        output.commit(record)
        # A copy for whoever reads the manifest, derived from the record and written
        # after it: a crash between leaves it absent, never disagreeing; no reader reads it.
        output.amend("run", c.MANIFEST_PACKS, summaries)
    return {**record, "files": output.files()}


def _pack_identity(indexes: Mapping[str, PackIndex], data_run_id: str | None) -> str:
    """The identity of an `etl pack`: 16 hex digits of a sha256 over its inputs and
    options (the data run's identity, per split the fingerprint of the data, strategy, S, seed,
    options and truncation), so packing the same data the same way again writes the same bytes."""
    body = {split: {"fingerprint": i.fingerprint, "strategy": i.strategy, "seq_len": i.seq_len, "seed": i.seed,
                    "options": i.options, "truncation": i.truncation} for split, i in indexes.items()}
    return identity_of({"etl_version": __version__, "format_version": PACKS_FORMAT_VERSION,
                        c.DATA_RUN_ID: data_run_id, "splits": body})


def read_record(dst: str | os.PathLike[str]) -> dict[str, Any] | None:
    """DST's `_packs.json`, or None when `etl pack` has not written one.

    Raises:
        EtlError: the record is unreadable or of a newer format.
    """
    path = Path(dst) / c.PACKS_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise EtlError(f"{path} is unreadable ({exc}); {REPACK}") from exc
    if not isinstance(record, dict) or not isinstance(record.get("splits"), dict):
        raise EtlError(f"{path} is not a pack index record; {REPACK}")
    if record.get("format_version", 0) > PACKS_FORMAT_VERSION:
        raise EtlError(f"{path} was written by a newer etl (format {record['format_version']}); "
                       "upgrade etl or rerun `etl pack` with this one")
    # Verified before trusted, as the manifest is: format 2 records carry their checksum (1: none).
    check_seal(record, path, fix=REPACK, required=record.get("format_version", 0) != 1)
    return record


def pack_files(dst: str | os.PathLike[str], split: str, record: dict[str, Any],
               manifest: dict[str, Any]) -> list[Path]:
    """The index parts of `split` the record lists, checked, after checking its fingerprint: the
    one check of every reader of the index (the loader, `etl inspect --pack`, `etl stats`).

    Each part is checked as the run's parts are (`check_part`), sha256 included: DuckDB verifies
    no page checksum, and the index is small (~20 MB per 1M examples; its hash: docs/design.md,
    Measured costs).

    Raises:
        EtlError: the split's data changed since it was packed (stale index), or a part is
            missing or differs from what the record lists.
    """
    root = Path(dst)
    summary = record["splits"][split]
    current = fingerprint(split_parts(root, split, manifest), root, manifest)
    if current != summary.get("fingerprint") or record.get(c.DATA_RUN_ID) != manifest.get(c.RUN_ID):
        raise EtlError(
            f"the pack index of split {split!r} in {root} was built from other data than "
            f"{c.DATA_DIR}/{split} holds now; {REPACK} {root} --strategy {summary.get('strategy')} "
            f"--seq-len {summary.get('seq_len')}"
        )
    prefix = f"{c.PACKS_DIR}/{split}/"
    listed = sorted(p for p in record_paths(record) if p.startswith(prefix) and p.endswith(".parquet"))
    entries = {e["path"]: e for e in record.get("files", []) if isinstance(e, dict)}
    run_id, data_run_id = record.get(c.RUN_ID), record.get(c.DATA_RUN_ID)
    # A record of an etl before pack identities has none: its parts are checked without.
    identity = identity_keys(run_id, data_run_id=data_run_id) if isinstance(run_id, str) else None
    for rel in listed:
        check_part(root / rel, entries[rel], checksum=True, identity=identity, record=c.PACKS_FILE, fix=REPACK)
    return [root / rel for rel in listed]


def read_pack_index(dst: str | os.PathLike[str], split: str, *, ids: bool = True) -> PackIndex | None:
    """The pack index `etl pack` wrote for `split`, or None when DST has none for it.

    Args:
        dst: an `etl run` output.
        split: the split.
        ids: also read the example id of every piece (the loader needs only rows: ``ids=False``
            skips decoding ~1M strings: docs/design.md, Measured costs).

    Raises:
        EtlError: the index no longer matches the split's data (the message says to rerun
            `etl pack`), or its files are damaged.
    """
    record = read_record(dst)
    if record is None or split not in record["splits"]:
        return None
    summary = record["splits"][split]
    files = pack_files(dst, split, record, read_manifest(dst))
    columns = [n for n in PACKS_SCHEMA.names if ids or n != c.PIECE_IDS]
    table = pa.concat_tables([open_part(p).read(columns=columns) for p in files])
    packing, piece_ids = index_packing(table, ids=ids)
    if packing.num_packs != summary.get("num_packs"):
        raise EtlError(f"the pack index of split {split!r} in {dst} lacks packs its record lists; {REPACK}")
    return PackIndex(
        packing=packing,
        strategy=summary["strategy"],
        seq_len=int(summary["seq_len"]),
        seed=int(summary.get("seed", 0)),
        options=dict(summary.get("options") or {}),
        fingerprint=summary["fingerprint"],
        ids=piece_ids,
        clipped=int(summary.get("clipped", 0)),
        truncation=summary.get("truncation", "right"),
        example_tokens=int(summary.get("example_tokens", 0)),
        skipped_tokens=int(summary.get("skipped_tokens", 0)),
    )
