"""Write and read `DST/packs/<split>/part-*.parquet`, the pack index, under etl's writer protocol.

`etl pack` is an `OutputWriter` of kind "pack": it replaces only the previous pack index, records
what it wrote in `_packs.json` (per split: strategy, S, seed, options, counts, utilization and the
fingerprint of the data it was built from) and copies that summary into the run manifest's
`packs` key. A new `etl run` removes both. Readers trust an index only while its fingerprint
matches the split's data parts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from etl import columns as c
from etl.errors import EtlError
from etl.output.manifest import read_manifest
from etl.output.ownership import OutputWriter, record_paths
from etl.output.part_writer import PartWriter
from etl.output.parts import fingerprint, open_part
from etl.packing.index import PACKS_SCHEMA, PackIndex, index_packing, index_table, split_parts

PACKS_FORMAT_VERSION = 1
# Packs per part file: ~256k packs of ~8 pieces each is ~2M pieces, ~20 MB of Parquet, so a
# split of 1M examples stays one or two files and a reader never holds more than one part twice.
PACKS_PER_PART = 1 << 18
REPACK = "rerun `etl pack`"


def write_pack_index(dst: str | os.PathLike[str], indexes: Mapping[str, PackIndex]) -> dict[str, Any]:
    """Replace DST's pack index with `indexes` (split -> index); returns the `_packs.json` record.

    Holds DST's lock throughout: the previous index goes first, then each split's parts, the
    record and the manifest's `packs` summary. An index built from data that changed since
    (another `etl run` meanwhile) is refused.

    Raises:
        EtlError: DST is not a finished `etl run` output, an index is stale, or a file of the
            user's lies where a part goes (it is never overwritten).
    """
    root = Path(dst)
    read_manifest(root)  # not an etl run output: one clear line, nothing touched
    with OutputWriter(root, kind="pack") as output:
        output.amend("run", c.MANIFEST_PACKS, None)  # its index is gone: so is its summary
        manifest = read_manifest(root)
        for split, index in indexes.items():
            current = fingerprint(split_parts(root, split, manifest), root, manifest)
            if current != index.fingerprint:
                raise EtlError(f"the data of split {split!r} in {root} changed while it was packed; {REPACK}")
        parts = PartWriter(output)
        summaries = {}
        for split in sorted(indexes):
            table = index_table(indexes[split])
            for start in range(0, table.num_rows, PACKS_PER_PART):
                parts.write(f"{c.PACKS_DIR}/{split}", table.slice(start, PACKS_PER_PART))
            summaries[split] = indexes[split].summary()
        record = {"format_version": PACKS_FORMAT_VERSION, "splits": summaries}
        output.commit(record)
        output.amend("run", c.MANIFEST_PACKS, summaries)
    return {**record, "files": output.files()}


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
    return record


def pack_files(dst: str | os.PathLike[str], split: str, record: dict[str, Any],
               manifest: dict[str, Any]) -> list[Path]:
    """The index parts of `split` the record lists, checked, after checking its fingerprint.

    Raises:
        EtlError: the split's data changed since it was packed (stale index), or a part is
            missing or differs from what the record lists.
    """
    root = Path(dst)
    summary = record["splits"][split]
    current = fingerprint(split_parts(root, split, manifest), root, manifest)
    if current != summary.get("fingerprint"):
        raise EtlError(
            f"the pack index of split {split!r} in {root} was built from other data than "
            f"{c.DATA_DIR}/{split} holds now; {REPACK} {root} --strategy {summary.get('strategy')} "
            f"--seq-len {summary.get('seq_len')}"
        )
    prefix = f"{c.PACKS_DIR}/{split}/"
    listed = sorted(p for p in record_paths(record) if p.startswith(prefix) and p.endswith(".parquet"))
    entries = {e["path"]: e for e in record.get("files", []) if isinstance(e, dict)}
    for rel in listed:
        path, entry = root / rel, entries[rel]
        if not path.is_file() or path.stat().st_size != entry.get("bytes"):
            raise EtlError(f"{path} is missing or changed since `etl pack` wrote it; {REPACK}")
        if pq.read_metadata(path).num_rows != entry.get("rows"):
            raise EtlError(f"{path} has other rows than `etl pack` wrote; {REPACK}")
    return [root / rel for rel in listed]


def read_pack_index(dst: str | os.PathLike[str], split: str, *, ids: bool = True) -> PackIndex | None:
    """The pack index `etl pack` wrote for `split`, or None when DST has none for it.

    Args:
        dst: an `etl run` output.
        split: the split.
        ids: also read the example id of every piece (the loader needs only rows: ``ids=False``
            skips decoding ~1M strings, ~0.1 s).

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
    )
