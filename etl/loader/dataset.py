"""Map-style torch Dataset over ``DST/data/<split>/*.parquet`` that reads whole row groups lazily.

The row index comes from Parquet footers (plus row-group statistics for the min-tokens filter), so
opening a split of any size costs milliseconds and no data pages; a small LRU cache per process
(one per DataLoader worker) holds the decoded row groups in use.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch.utils.data

from etl.columns import (
    DATA_DIR,
    DEFAULT_DOMAIN,
    DOMAIN,
    IMAGES,
    INPUT_IDS,
    LOSS_MASK,
    LOSS_WEIGHT,
    MANIFEST_KIND,
    NUM_TOKENS,
)
from etl.errors import EtlError
from etl.kinds import KINDS, SFT
from etl.loader.collate import IMAGE_KEYS
from etl.loader.images import ImageColumns, VisionBatch, attach, check_whole, manifest_rules
from etl.loader.pack_request import PackRequest
from etl.loader.pairs.pack import LabeledPack, PackedPairs, pair_pieces
from etl.loader.pairs.rows import PairRows, concat_rows, part_columns, read_rows
from etl.output.manifest import read_manifest
from etl.output.parts import fingerprint, listed_parts, listed_splits, open_part
from etl.ragged import PackedBatch, Ragged, concat, from_arrow

if TYPE_CHECKING:
    from etl.images.pixels import PixelRule


class ParquetDataset(torch.utils.data.Dataset):
    """Examples of one split of an ``etl run`` output, row-group by row-group.

    ``dataset[i]`` returns ``{"input_ids": int32 array, "loss_mask": bool array}`` (views into the
    cached row group; for the manifest kinds ``preference`` / ``unpaired``, the row's
    ``prompt_ids``, ``chosen_ids``, ``rejected_ids`` and masks, or ``completion_ids`` and ``label``); ``dataset.__getitems__(indices)`` (what DataLoader calls with a batch
    sampler) returns one `Ragged` batch in the order asked, for the vectorized collate.

    Args:
        dst: an ``etl run`` output directory (with ``_manifest.json``).
        split: ``train`` or ``val``.
        min_tokens: skip examples shorter than this (the episode loader's ``episode_min_tokens``); 0 keeps all.
        cache_row_groups: decoded row groups always kept per process (~5 bytes per token).
        cache_mb: keep more row groups while they fit in this many MiB (per process, so per
            DataLoader worker): a split that fits is read once, whatever the shuffle.
        weights: read ``loss_weight`` when the data has it; None (default) does so whenever
            the column exists, False ignores it.
        pixels: image data's mean, std, rescale and filter (`etl.images.pixels.PixelRule`); default
            the run's processor's (`etl.loader.images.manifest_rules`). Batches of image data
            are `VisionBatch`es: their images decoded here, in the DataLoader's workers.
    """

    def __init__(
        self,
        dst: str | os.PathLike[str],
        *,
        split: str = "train",
        min_tokens: int = 2,
        cache_row_groups: int = 8,
        cache_mb: float = 256,
        weights: bool | None = None,
        pixels: PixelRule | None = None,
    ):
        self.dst, self.split = Path(dst), split
        self.manifest: dict[str, Any] = read_manifest(dst)
        # Exactly the parts the manifest lists, each checked for size, rows, run identity and
        # sha256, and the manifest's S against their longest row (`listed_parts`): the sha256 reads
        # the split once at open (on up to 8 threads, once per process; its cost: docs/design.md,
        # Measured costs), never per batch; workers get this checked object. Page checksums are
        # verified as groups are read.
        self.files = listed_parts(self.dst, f"{DATA_DIR}/{split}", manifest=self.manifest)
        if not self.files:
            raise EtlError(
                f"no Parquet files in {self.dst / DATA_DIR / split}; splits present: "
                f"{listed_splits(self.dst, self.manifest) or 'none'}"
            )
        self.fingerprint = fingerprint(self.files, self.dst, self.manifest)
        self.cache_row_groups = max(1, cache_row_groups)
        self.cache_bytes = int(cache_mb * 2**20)
        schema = pq.read_schema(self.files[0])
        # What a row is: an SFT example, or a preference pair / unpaired completion (`PairRows`).
        self.kind: str = self.manifest.get(MANIFEST_KIND) or SFT
        self.pairs = KINDS[self.kind].pair if self.kind in KINDS else True  # part_columns refuses an unknown kind
        self.columns = part_columns(self.kind, schema.names) if self.pairs else [INPUT_IDS, LOSS_MASK]
        if weights is not False and LOSS_WEIGHT in schema.names and not self.pairs:
            self.columns.append(LOSS_WEIGHT)
        missing = [] if self.pairs else [c for c in (INPUT_IDS, LOSS_MASK) if c not in schema.names]
        if missing:
            raise EtlError(f"{self.files[0]} lacks columns {missing}; rerun `etl run`")
        self._index_row_groups()
        self.images = None if IMAGES not in schema.names or self.pairs else ImageColumns(
            self.files, self._group_file, self._group_index, self._group_start, *manifest_rules(self.manifest, pixels),
            cache_row_groups=self.cache_row_groups, cache_bytes=self.cache_bytes)
        self._rows = self._filter(min_tokens) if min_tokens > 0 else None
        self._reset_process_state()

    def _index_row_groups(self) -> None:
        """(file, row group) of every group and the global row where each group starts."""
        group_file, group_index, counts, self._stats_min = [], [], [], []
        self._decoded_bytes = 0
        for f, path in enumerate(self.files):
            meta = pq.read_metadata(path)
            col = meta.schema.names.index(NUM_TOKENS) if NUM_TOKENS in meta.schema.names else None
            for g in range(meta.num_row_groups):
                rg = meta.row_group(g)
                # Uncompressed size of the columns read: ~ their decoded size, from the footer.
                self._decoded_bytes += sum(rg.column(j).total_uncompressed_size for j in range(rg.num_columns)
                                           if rg.column(j).path_in_schema.split(".")[0] in self.columns)
                group_file.append(f)
                group_index.append(g)
                counts.append(rg.num_rows)
                stats = rg.column(col).statistics if col is not None else None
                self._stats_min.append(
                    stats.min if stats is not None and stats.has_min_max else None
                )
        self._group_file = np.array(group_file, dtype=np.int64)
        self._group_index = np.array(group_index, dtype=np.int64)
        self._group_start = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])

    def _filter(self, min_tokens: int) -> np.ndarray | None:
        """Global rows with at least ``min_tokens`` tokens; None when every row qualifies.

        Row groups whose ``num_tokens`` minimum (footer statistics) already passes are not read;
        the others read only that int32 column (4 bytes per row).
        """
        keep, all_pass = [], True
        for g in range(len(self._group_file)):
            lo, hi = self._group_start[g], self._group_start[g + 1]
            if self._stats_min[g] is not None and self._stats_min[g] >= min_tokens:
                keep.append(np.arange(lo, hi, dtype=np.int64))
                continue
            pf = open_part(self.files[self._group_file[g]])
            if NUM_TOKENS in pf.schema_arrow.names:
                lengths = pf.read_row_group(int(self._group_index[g]), columns=[NUM_TOKENS])[0]
            else:  # older files: derive lengths from the ids column (reads it once)
                ids = pf.read_row_group(int(self._group_index[g]), columns=[INPUT_IDS])[0]
                lengths = pc.list_value_length(ids)
            ok = np.asarray(lengths.to_numpy(zero_copy_only=False)) >= min_tokens
            all_pass &= bool(ok.all())
            keep.append(lo + np.flatnonzero(ok))
        return None if all_pass else np.concatenate(keep)

    def _reset_process_state(self) -> None:
        # File handles and the cache belong to one process: a forked or spawned DataLoader worker
        # starts empty instead of sharing file offsets with its parent.
        self._pid = os.getpid()
        self._handles: dict[int, pq.ParquetFile] = {}
        self._cache: OrderedDict[int, Ragged | PairRows] = OrderedDict()
        self._cached_bytes = 0
        self._whole: Ragged | PairRows | None = None
        self.row_group_reads = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_handles={}, _cache=OrderedDict(), _cached_bytes=0, _whole=None, row_group_reads=0)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_process_state()

    def __len__(self) -> int:
        return int(self._group_start[-1]) if self._rows is None else len(self._rows)

    @property
    def row_groups(self) -> np.ndarray:
        """(len,) global row-group number of every example: the block labels for the sampler."""
        rows = self._global_rows(np.arange(len(self), dtype=np.int64))
        return np.searchsorted(self._group_start, rows, side="right") - 1

    def _global_rows(self, indices: np.ndarray) -> np.ndarray:
        n = len(self)
        if indices.size and (indices.min() < -n or indices.max() >= n):
            raise IndexError(f"index out of range for a dataset of {n} rows")
        indices = np.where(indices < 0, indices + n, indices)
        return indices if self._rows is None else self._rows[indices]

    def _row_group(self, g: int) -> Ragged | PairRows:
        """Decoded row group ``g`` (LRU cached; one read of its id/mask columns on a miss)."""
        if os.getpid() != self._pid:
            self._reset_process_state()
        if g in self._cache:
            self._cache.move_to_end(g)
            return self._cache[g]
        ragged = self._read_group(g)
        self._cache[g] = ragged
        self._cached_bytes += _nbytes(ragged)
        while len(self._cache) > self.cache_row_groups and self._cached_bytes > self.cache_bytes:
            self._cached_bytes -= _nbytes(self._cache.popitem(last=False)[1])
        return ragged

    def _read_group(self, g: int) -> Ragged | PairRows:
        f = int(self._group_file[g])
        if f not in self._handles:
            self._handles[f] = open_part(self.files[f])
        try:
            table = self._handles[f].read_row_group(int(self._group_index[g]), columns=self.columns)
        except OSError as exc:  # a page checksum that fails: the part changed after the run
            raise EtlError(f"{self.files[f]}: {exc}; it changed after etl wrote it, rerun `etl run`") from exc
        self.row_group_reads += 1
        if self.pairs:
            return read_rows(self.kind, table)
        weight = table.column(LOSS_WEIGHT) if LOSS_WEIGHT in self.columns else None
        return from_arrow(table.column(INPUT_IDS), table.column(LOSS_MASK), weight)

    def _whole_split(self) -> Ragged | PairRows | None:
        """The whole split as one `Ragged` (global rows index it) when it fits in ``cache_mb``.

        Packs gather examples from all over the split: on T0 a batch of 32 packs touches ~40 of
        54 row groups, and a pass per group is a few small numpy calls, so a batch's ~40 passes
        cost ~40 times one gather from the whole split (docs/design.md, Measured costs). Size:
        ~5 bytes a token (T0: 14M tokens, ~75 MB).
        """
        if os.getpid() != self._pid:
            self._reset_process_state()
        if self._whole is None and self._decoded_bytes <= self.cache_bytes:
            self._whole = _concat([self._read_group(g) for g in range(len(self._group_file))])
        return self._whole

    def _locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row group, row inside it) of global rows."""
        groups = np.searchsorted(self._group_start, rows, side="right") - 1
        return groups, rows - self._group_start[groups]

    def global_rows(self) -> np.ndarray:
        """(len,) global row (over the split's listed parts) of every example of the dataset."""
        return self._global_rows(np.arange(len(self), dtype=np.int64))

    def example_lengths(self) -> np.ndarray:
        """(len,) int64 tokens of every example: the ``num_tokens`` column (4 bytes a row)."""
        lengths = []
        for f, path in enumerate(self.files):
            pf = self._handles.get(f) or open_part(path)
            if NUM_TOKENS in pf.schema_arrow.names:
                column = pf.read(columns=[NUM_TOKENS])[0]
            else:  # older files: derive lengths from the ids column (reads it once)
                column = pc.list_value_length(pf.read(columns=[INPUT_IDS])[0])
            lengths.append(column.to_numpy().astype(np.int64, copy=False))
        every = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
        return every if self._rows is None else every[self._rows]

    def domain_codes(self) -> tuple[np.ndarray, list[str]]:
        """(len,) int64 domain code of every example and the domain name of each code.

        The ``domain`` column of every part, dictionary-encoded by pyarrow (~10 bytes a row
        read, one hash pass); a null, or a part without the column, reads as ``__default__``.
        Codes number only the domains the dataset's rows hold (after ``min_tokens``).
        """
        chunks = []
        for f, path in enumerate(self.files):
            pf = self._handles.get(f) or open_part(path)
            if DOMAIN in pf.schema_arrow.names:
                chunks.extend(pf.read(columns=[DOMAIN])[0].cast(pa.string()).chunks)
            else:
                chunks.append(pa.nulls(pf.metadata.num_rows, pa.string()))
        column = pc.fill_null(pa.chunked_array(chunks, type=pa.string()).combine_chunks(), DEFAULT_DOMAIN)
        encoded = pc.dictionary_encode(column)
        codes = encoded.indices.to_numpy().astype(np.int64)
        codes = codes if self._rows is None else codes[self._rows]
        used = np.bincount(codes, minlength=len(encoded.dictionary)) > 0
        names = [n for n, u in zip(encoded.dictionary.to_pylist(), used, strict=True) if u]
        return (np.cumsum(used) - 1)[codes], names

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        groups, local = self._locate(self._global_rows(np.array([index], dtype=np.int64)))
        rg = self._row_group(int(groups[0]))
        if isinstance(rg, PairRows):  # TRL's column names: prompt_ids, chosen_ids, ...
            return rg.example(int(local[0]))
        start = int(rg.starts[local[0]])
        span = slice(start, start + int(rg.lengths[local[0]]))
        item = {INPUT_IDS: rg.ids[span], LOSS_MASK: rg.mask[span]}  # type: ignore[index]
        if rg.weight is not None:
            item[LOSS_WEIGHT] = rg.weight[span]
        if self.images is not None:
            item.update(zip(IMAGE_KEYS, self.images.images(self._global_rows(np.array([index]))), strict=True))
        return item

    def __getitems__(self, indices: list[int] | PackRequest) -> Ragged | PackedBatch | PairRows | PackedPairs | LabeledPack | VisionBatch:
        """A whole batch in the order asked: rows (a `Ragged`; `PairRows` for the pair kinds), or the
        pieces of packs (a `PackedBatch`; `PackedPairs` / `LabeledPack`) when the sampler is a `PackSampler`;
        with images, either inside a `VisionBatch` with its pixels."""
        if isinstance(indices, PackRequest):
            batch, rows = self._pieces(indices), indices.rows
        else:
            rows = self._global_rows(np.asarray(indices, dtype=np.int64))
            batch = self._take(rows)
        return batch if self.images is None else attach(batch, self.images, rows)

    def _pieces(self, req: PackRequest) -> PackedBatch | PackedPairs | LabeledPack:
        """Each piece as a range of its example's tokens: views into the whole split when it is
        cached (no copy before the collate's gather), else its examples copied once."""
        rows = np.asarray(req.rows, dtype=np.int64)
        docs = self._whole_split()
        if docs is None:
            docs, rows = self._take(rows), np.arange(len(rows), dtype=np.int64)
        if isinstance(docs, PairRows):
            return pair_pieces(docs, rows, req)
        starts, lengths = docs.starts[rows], docs.lengths[rows]
        if np.any(req.start + req.length > lengths):
            raise EtlError(f"a pack reaches past its example in {self.dst}; rerun `etl pack`")
        if self.images is not None:
            check_whole(self.images, np.asarray(req.rows, dtype=np.int64), req.start, req.length, lengths)
        pieces = Ragged(docs.ids, starts + req.start, req.length, docs.mask, docs.weight)
        return PackedBatch(pieces, req.row, req.segment, req.num_rows, req.trained)

    def _take(self, rows: np.ndarray) -> Ragged | PairRows:
        """Examples at global ``rows``: one pass per row group touched (not per example)."""
        groups, local = self._locate(rows)
        parts, positions = [], []
        for g in np.unique(groups):  # a handful of row groups per batch under block shuffling
            sel = np.flatnonzero(groups == g)
            parts.append(self._row_group(int(g)).take(local[sel]))
            positions.append(sel)
        joined = _concat(parts)
        inverse = np.empty(len(rows), dtype=np.int64)
        inverse[np.concatenate(positions)] = np.arange(len(rows))
        return joined.reorder(inverse)


def _concat(parts: list[Any]) -> Any:
    """Join row groups: `PairRows` (pair kinds) or `Ragged` (SFT)."""
    return concat_rows(parts) if isinstance(parts[0], PairRows) else concat(parts)


def _nbytes(r: Ragged | PairRows) -> int:
    if isinstance(r, PairRows):
        return r.nbytes
    arrays = (r.ids, r.starts, r.lengths, r.mask, r.weight)
    return sum(a.nbytes for a in arrays if a is not None)
