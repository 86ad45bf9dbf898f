"""The episode export: its layout written from Parquet (`etl export --format episodes`) and read back.

``OUT/<split>/tokens.bin`` uint32 ids, ``mask.bin`` uint8 0/1 aligned to tokens, ``episodes.idx``
16-byte records (start uint64, length uint64); ``OUT/meta.json`` (an extension) keeps the pad/eot
ids so the loader needs no tokenizer. Episode k of a split is row k of the Parquet split.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from etl.columns import DATA_DIR, INPUT_IDS, LOSS_MASK, SPLITS
from etl.errors import EtlError
from etl.export.backends import META_FILE
from etl.export.token_files import memmap_file
from etl.output.manifest import read_manifest
from etl.output.ownership import tmp_of
from etl.output.parts import listed_parts, listed_splits, open_part
from etl.output.writer import OutputWriter
from etl.ragged import from_arrow
from etl.ui.progress import rows_bar

TOKENS_FILE, MASK_FILE, INDEX_FILE = "tokens.bin", "mask.bin", "episodes.idx"


def _export_split(files: list[Path], out: Path, *, mask: bool, output: OutputWriter) -> dict[str, int]:
    """Stream one split, row group by row group (memory: one row group), to temp files."""
    names = [TOKENS_FILE, INDEX_FILE] + ([MASK_FILE] if mask else [])
    for n in names:  # journaled (and refused below a link) before created; the temp names go with them
        output.reserve(out / n)
    out.mkdir(parents=True, exist_ok=True)
    handles = {n: open(tmp_of(out / n), "wb") for n in names}  # noqa: SIM115 (closed below)
    episodes = tokens = 0
    bar = rows_bar(files, desc=f"etl export {out.name}")
    try:
        for path in files:
            pf = open_part(path)
            for g in range(pf.num_row_groups):
                table = pf.read_row_group(g, columns=[INPUT_IDS, LOSS_MASK])
                bar.update(table.num_rows)
                rg = from_arrow(table.column(INPUT_IDS), table.column(LOSS_MASK))
                if rg.ids.size and (rg.ids.min() < 0 or rg.ids.max() > np.iinfo(np.uint32).max):
                    raise EtlError(f"{path}: token ids outside uint32; episodes cannot hold them")
                rg.ids.astype(np.uint32).tofile(handles[TOKENS_FILE])
                if mask:
                    rg.mask.astype(np.uint8).tofile(handles[MASK_FILE])  # type: ignore[union-attr]
                index = np.stack([rg.starts + tokens, rg.lengths], axis=1).astype(np.uint64)
                index.tofile(handles[INDEX_FILE])
                episodes, tokens = episodes + len(rg), tokens + int(rg.ids.size)
    finally:
        bar.close()
        for h in handles.values():
            h.close()
    for n in names:  # rename only after every file is complete
        os.replace(tmp_of(out / n), out / n)
        output.add(out / n)
    return {"episodes": episodes, "tokens": tokens}



def export_episodes(
    dst: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    splits: tuple[str, ...] = SPLITS,
    mask: bool = True,
) -> dict[str, dict[str, int]]:
    """Write the splits of an ``etl run`` output in the episode layout.

    Args:
        dst: ``etl run`` output directory.
        out: dataset_dir to create (``out/train``, ``out/val``, ``out/meta.json``).
        splits: splits to export; one that has no Parquet files in ``dst`` is skipped.
        mask: also write ``mask.bin``.

    Returns:
        ``{split: {"episodes": n, "tokens": m}}`` for every split written.

    Raises:
        EtlError: when ``dst`` is not a finished run or none of the splits exist.
    """
    manifest = read_manifest(dst)
    out = Path(out)
    have = listed_splits(dst, manifest)
    chosen = {s: listed_parts(dst, f"{DATA_DIR}/{s}", manifest=manifest, checksum=True)
              for s in splits if s in have}
    if not chosen:
        raise EtlError(f"no Parquet data for splits {list(splits)} under {Path(dst) / DATA_DIR}")
    # OUT is claimed like a run's DST: the previous export's files (OUT/_export.json) are
    # replaced, so a split this export does not write cannot survive from the last one.
    with OutputWriter(out, kind="export") as output:
        counts = {s: _export_split(files, out / s, mask=mask, output=output) for s, files in chosen.items()}
        meta = {
            "source": str(Path(dst).resolve()),
            "pad_id": manifest.get("pad_id"),
            "eot_id": manifest.get("eot_id"),
            "seq_len": manifest.get("seq_len"),
            "tokenizer": manifest.get("tokenizer"),
            "template": manifest.get("template"),
            "splits": counts,
        }
        path = output.reserve(out / META_FILE)
        tmp_of(path).write_text(json.dumps(meta, indent=2, sort_keys=True, allow_nan=False) + "\n", encoding="utf-8")
        os.replace(tmp_of(path), path)
        output.add(path)
        output.commit({"format": "episodes", "source": meta["source"], "splits": counts})
    return counts


@dataclass(frozen=True)
class EpisodeSplit:
    """One split of an episode dataset, memory-mapped (pages are read only when touched).

    Attributes:
        tokens: (num_tokens,) uint32 memmap.
        index: (num_episodes, 2) uint64 (start, length), loaded into RAM (16 bytes per episode).
        mask: uint8 or float32 memmap aligned to tokens, or None when absent or incomplete.
        mask_note: why the mask is None (empty when it is present).
    """

    tokens: np.ndarray
    index: np.ndarray | None
    mask: np.ndarray | None
    mask_note: str = ""


def open_split(directory: str | os.PathLike[str], *, need_index: bool = True) -> EpisodeSplit:
    """Open ``directory`` (e.g. ``dataset_dir/train``) of the episode layout.

    Args:
        directory: holds ``tokens.bin``, ``episodes.idx`` and optionally ``mask.bin``.
        need_index: False for token_stream mode, which reads tokens only.

    Raises:
        EtlError: when a required file is missing or malformed.
    """
    d = Path(directory)
    required = [TOKENS_FILE] + ([INDEX_FILE] if need_index else [])
    missing = [n for n in required if not (d / n).is_file()]
    if missing:
        raise EtlError(
            f"{d} lacks {missing}; create it with `etl export DST {d.parent} --format episodes`"
        )
    tokens = memmap_file(d / TOKENS_FILE, np.uint32)
    index = None
    if (d / INDEX_FILE).is_file():
        size = (d / INDEX_FILE).stat().st_size
        if size % 16:
            raise EtlError(f"{d / INDEX_FILE} is {size} bytes, not a multiple of 16: re-export it")
        index = np.fromfile(d / INDEX_FILE, dtype=np.uint64).reshape(-1, 2)
        if index.size and int((index[:, 0] + index[:, 1]).max()) > tokens.shape[0]:
            raise EtlError(f"{d / INDEX_FILE} points past the end of {TOKENS_FILE}: re-export it")
    mask, note = None, f"{MASK_FILE} absent"
    if (d / MASK_FILE).is_file():
        size, n = (d / MASK_FILE).stat().st_size, tokens.shape[0]
        # The layout allows uint8 or float32 masks; the file size tells which.
        dtype = np.uint8 if size == n else np.float32 if size == 4 * n else None
        if dtype is None:
            note = f"{MASK_FILE} has {size} bytes for {n} tokens (incomplete)"
        else:
            mask, note = memmap_file(d / MASK_FILE, dtype), ""
    return EpisodeSplit(tokens, index, mask, note)
