"""The export stage of `etl run`: a config's `output.storage_format` writes the token files into DST.

After the run's manifest, the finished Parquet output is read back and written as the bin/h5
export (etl.export.token_files) into DST itself: the train split as `DST/<domain>/`, the val split
as `DST/_val/<domain>/`. One export writer owns them all (`DST/_export.json` lists every file), so
the next run, or `etl export DST DST`, removes exactly these files; the run's manifest stays as the
run wrote it. Cost: one read of the data parts and one write of 16 bytes per token (bin; the read's
rate: docs/design.md, Measured costs).
"""

from __future__ import annotations

import os
from pathlib import Path

from etl import columns as c
from etl.export.token_files import check_options, write_split
from etl.ingest.discover import is_uri
from etl.ingest.location import local_path
from etl.output.manifest import read_manifest
from etl.output.parts import listed_parts, listed_splits
from etl.output.writer import OutputWriter

__all__ = ["export_run", "export_stage", "split_folder"]


def split_folder(dst: Path, split: str) -> Path:
    """Where the export stage writes a split's domain folders: DST for train, DST/_val for val
    (`etl.columns.SPLITS` are these two; `_val` is a name no domain folder takes)."""
    return dst if split == "train" else dst / c.VAL_STORAGE_DIR


def export_run(
    dst: str | os.PathLike[str], *, storage_format: str, max_tokens_per_shard: int, progress: bool = True
) -> dict[str, dict[str, dict[str, int]]]:
    """Write every split of the finished run in `dst` as `storage_format` token files into `dst`.

    Args:
        dst: the run's output folder (its manifest written).
        storage_format: ``"bin"`` or ``"h5"``.
        max_tokens_per_shard: tokens per shard file before a new one starts (>= 1).
        progress: a progress bar on a terminal (off for `etl run --quiet`).

    Returns:
        ``{split: {domain: {"sequences", "tokens", "trained", "shards"}}}``; empty (and no export
        record written) when the run wrote no data part.

    Raises:
        EtlError: as `etl.export.token_files.export_storage`.
    """
    check_options(storage_format, max_tokens_per_shard)
    dst = Path(dst)
    manifest = read_manifest(dst)
    splits = {split: listed_parts(dst, f"{c.DATA_DIR}/{split}", manifest=manifest, checksum=True)
              for split in listed_splits(dst, manifest)}
    splits = {split: parts for split, parts in splits.items() if parts}
    if not splits:
        return {}
    counts: dict[str, dict[str, dict[str, int]]] = {}
    with OutputWriter(dst, kind="export") as output:
        for split, parts in splits.items():
            counts[split] = write_split(parts, split_folder(dst, split), output=output,
                                        storage_format=storage_format, split=split,
                                        max_tokens_per_shard=max_tokens_per_shard, source=manifest, dst=dst,
                                        progress=progress)
        output.commit({"format": storage_format, "source": str(dst.resolve()), "written_by": "etl run",
                       "max_tokens_per_shard": max_tokens_per_shard,
                       "splits": {split: {"folder": split_folder(dst, split).relative_to(dst).as_posix(),
                                          "domains": domains} for split, domains in counts.items()}})
    return counts


def export_stage(dst: str, *, storage_format: str, max_tokens_per_shard: int, quiet: bool) -> list[str]:
    """`etl run`'s export stage (`output.storage_format`) into DST (a path or file:// URI) from the
    finished run; one summary line per split (none with --quiet)."""
    out = Path(local_path(dst, what="DST") if is_uri(dst) else dst)
    counts = export_run(out, storage_format=storage_format, max_tokens_per_shard=max_tokens_per_shard,
                        progress=not quiet)
    return [] if quiet else [
        f"etl run: {storage_format} token files of {split}: {sum(d['sequences'] for d in domains.values()):,} "
        f"sequences, {sum(d['tokens'] for d in domains.values()):,} tokens in {len(domains)} domain folder(s) of "
        f"{split_folder(out, split)}" for split, domains in counts.items()]
