"""Images of vision-language data in the loader: each batch's `pixel_values` and `image_grid_thw`.

`ParquetDataset.__getitems__` (so a DataLoader worker, not the training process) reads the
batch's images from the `images` column (bytes, or the file at `path` with `--images
reference`, checked against `image_sha256`) and decodes them (`etl.images.pixels`); the batch
travels as a `VisionBatch` and `TorchCollate` adds the two arrays to the tokens' collate. Text-only
data never reaches this module: its batches are the plain `Ragged` / `PackedBatch` as before.

An image's tokens must reach the model whole, beside its pixels: packers that cut examples
across rows (sequential, stream) are refused for image data, and so is an S that would cut an
image example (`check_cuts`); a pack piece that is not its whole example fails at its batch.
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.columns import IMAGE_GRID_THW, IMAGE_SHA256, IMAGES, NUM_IMAGE_TOKENS
from etl.errors import EtlError, EtlWarning
from etl.images.vision import VisionRule
from etl.loader.collate import PIXEL_VALUES
from etl.output.parts import open_part
from etl.packing.index import SPLITTING
from etl.ragged import PackedBatch, Ragged, range_gather

if TYPE_CHECKING:
    from etl.images.pixels import PixelRule

_MANIFEST_IMAGES = "images"  # the manifest's block: VisionRule's fields, mode, root


@dataclass(frozen=True)
class VisionBatch:
    """A batch's tokens (rows or pack pieces) and its images, in row (piece) order, then each
    example's own order: ``pixel_values`` (sum of t*h*w, C*T*p*p) float32, ``image_grid_thw``
    (N, 3) int64."""

    batch: Ragged | PackedBatch
    pixel_values: np.ndarray
    image_grid_thw: np.ndarray

    def arrays(self) -> dict[str, np.ndarray]:
        return {PIXEL_VALUES: self.pixel_values, IMAGE_GRID_THW: self.image_grid_thw}


class _Group(NamedTuple):
    """One row group's images: ``offsets`` (rows + 1) into the flat image arrays, ``grids``
    (N, 3) int64, ``data`` (binary, null with --images reference), ``path``, ``sha256``."""

    offsets: np.ndarray
    grids: np.ndarray
    data: pa.Array
    path: pa.Array
    sha256: pa.Array
    nbytes: int


def manifest_rules(manifest: dict[str, Any], pixels: PixelRule | None = None) -> tuple[VisionRule, PixelRule]:
    """The run's `VisionRule` (its manifest's `images` block) and the processor's `PixelRule`:
    ``pixels`` if given, else the block's mean/std keys if it has them, else the tokenizer
    folder's preprocessor_config.json, else Qwen2-VL's defaults (CLIP), with a warning."""
    from etl.images.pixels import PixelRule, load_pixel_rule, pixel_rule  # Pillow: image data only

    block = manifest.get(_MANIFEST_IMAGES) or {}
    missing = [f for f in VisionRule._fields if f not in block]
    if missing:
        raise EtlError(f"the manifest's images block lacks {missing}; rerun `etl run`")
    rule = VisionRule(**{f: block[f] for f in VisionRule._fields})
    if pixels is not None:
        return rule, pixels
    if "image_mean" in block:  # etl run writes them: the folder need not be there
        return rule, pixel_rule({k: block[k] for k in PixelRule._fields if k in block})
    folder = (manifest.get("tokenizer") or {}).get("name")
    found = load_pixel_rule(folder) if isinstance(folder, str) and Path(folder).is_dir() else None
    if found is None:
        warnings.warn(f"no preprocessor_config.json in the run's tokenizer folder {folder!r}: pixel values use "
                      "Qwen2-VL's default mean/std (CLIP); pass pixels=load_pixel_rule(<model folder>) to choose",
                      EtlWarning, stacklevel=3)
    return rule, found or PixelRule()


class ImageColumns:
    """The image columns of a split's parts, read per row group (LRU cached, per process).

    Args:
        files: the split's listed parts; group_file, group_index, group_start: the dataset's row
            groups (part, group inside it, first global row).
        rule, pixels: how images become pixel values (`manifest_rules`).
        cache_row_groups, cache_bytes: groups always kept, and more while under this many bytes
            (embedded image bytes: ~a row group's images each; paths only with --images reference).
    """

    def __init__(self, files: list[Path], group_file: np.ndarray, group_index: np.ndarray,
                 group_start: np.ndarray, rule: VisionRule, pixels: PixelRule, *, cache_row_groups: int,
                 cache_bytes: int):
        self.files, self.rule, self.pixels = files, rule, pixels
        self.group_file, self.group_index, self.group_start = group_file, group_index, group_start
        self.cache_row_groups, self.cache_bytes = cache_row_groups, cache_bytes
        self._reset()

    def _reset(self) -> None:
        self._pid, self._handles, self._cache, self._cached = os.getpid(), {}, OrderedDict(), 0

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_pid", "_handles", "_cache", "_cached")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def image_rows(self) -> np.ndarray:
        """(rows,) bool per global row: the example has images (`num_image_tokens`, 4 bytes a row)."""
        columns = [open_part(p).read(columns=[NUM_IMAGE_TOKENS])[0] for p in self.files]
        return np.concatenate([c.to_numpy().astype(np.int64) > 0 for c in columns])

    def _group(self, g: int) -> _Group:
        if os.getpid() != self._pid:
            self._reset()
        if g in self._cache:
            self._cache.move_to_end(g)
            return self._cache[g]
        f = int(self.group_file[g])
        if f not in self._handles:
            self._handles[f] = open_part(self.files[f])
        try:
            table = self._handles[f].read_row_group(int(self.group_index[g]), columns=[IMAGES, IMAGE_GRID_THW, IMAGE_SHA256])
        except OSError as exc:  # a page checksum that fails
            raise EtlError(f"{self.files[f]}: {exc}; it changed after etl wrote it, rerun `etl run`") from exc
        images, grids = table.column(IMAGES).combine_chunks(), table.column(IMAGE_GRID_THW).combine_chunks()
        flat, cells = images.flatten(), grids.flatten()
        if (pc.list_value_length(cells).to_numpy(zero_copy_only=False) != 3).any():
            raise EtlError(f"{self.files[f]}: an image grid is not [t, h, w]; rerun `etl run`")
        group = _Group(offsets=_zero_based(images.offsets.to_numpy()),
                       grids=cells.flatten().to_numpy().astype(np.int64).reshape(-1, 3),
                       data=flat.field("bytes"), path=flat.field("path"),
                       sha256=table.column(IMAGE_SHA256).combine_chunks().flatten(), nbytes=table.nbytes)
        self._cache[g], self._cached = group, self._cached + group.nbytes
        while len(self._cache) > self.cache_row_groups and self._cached > self.cache_bytes:
            self._cached -= self._cache.popitem(last=False)[1].nbytes
        return group

    def _touch(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[int, _Group], np.ndarray]:
        """Row group and row inside it of global ``rows``, the groups touched, images per row."""
        groups = np.searchsorted(self.group_start, rows, side="right") - 1
        local = rows - self.group_start[groups]
        counts = np.zeros(len(rows), dtype=np.int64)
        touched = {int(g): self._group(int(g)) for g in np.unique(groups)}
        for g, group in touched.items():  # a handful of groups a batch
            sel = groups == g
            counts[sel] = np.diff(group.offsets)[local[sel]]
        return groups, local, touched, counts

    def images_per_row(self, rows: np.ndarray) -> np.ndarray:
        """(rows,) int64 images of the examples at global ``rows``."""
        return self._touch(np.asarray(rows, dtype=np.int64))[3]

    def images(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``pixel_values`` and ``image_grid_thw`` of the examples at global ``rows``: row order,
        then each example's. One pass per row group touched, then one decode per image."""
        from etl.images.pixels import pixel_values  # Pillow: only for image data

        groups, local, touched, counts = self._touch(np.asarray(rows, dtype=np.int64))
        slots = np.cumsum(counts) - counts
        grids = np.zeros((int(counts.sum()), 3), dtype=np.int64)
        data: list[Any] = [None] * len(grids)
        names: list[str] = [""] * len(grids)
        for g, group in touched.items():
            sel = np.flatnonzero(groups == g)
            src = range_gather(group.offsets[local[sel]], counts[sel])
            dst = range_gather(slots[sel], counts[sel])
            grids[dst] = group.grids[src]
            for d, value, name in zip(dst.tolist(), *self._bytes(group, src), strict=True):  # per image
                data[d], names[d] = value, name
        return pixel_values(data, self.rule, grids, self.pixels, names=names), grids

    def _bytes(self, group: _Group, images: np.ndarray) -> tuple[list[bytes], list[str]]:
        """Each image's bytes (embedded, else its file's, sha256 checked: `read_checked`) and how
        errors name it (its path, as written or absolute)."""
        from etl.images.pixels import read_checked

        take = pa.array(images)
        data, paths = group.data.take(take).to_pylist(), group.path.take(take).to_pylist()
        missing = [k for k, value in enumerate(data) if value is None]
        if missing:
            sha = group.sha256.take(pa.array(images[missing])).to_pylist()
            for k, value in zip(missing, read_checked([paths[k] for k in missing], sha), strict=True):
                data[k] = value
        return data, [f"image {p}" if p else "an embedded image" for p in paths]


def attach(batch: Ragged | PackedBatch, columns: ImageColumns, rows: np.ndarray) -> VisionBatch:
    """``batch`` with the images of its examples (global ``rows``, one per row or piece)."""
    return VisionBatch(batch, *columns.images(rows))


def check_whole(columns: ImageColumns, rows: np.ndarray, start: np.ndarray, length: np.ndarray,
                full: np.ndarray) -> None:
    """Refuse a pack piece that is part of an image example (its image tokens could be cut)."""
    cut = (start != 0) | (length != full)
    if cut.any() and (columns.images_per_row(rows[cut]) > 0).any():
        raise EtlError("a pack cuts an example with images (a piece that is not its whole example); "
                       "an image's tokens must reach the model whole: pack with bfd or ffd at the run's S")


def check_cuts(image_rows: np.ndarray, lengths: np.ndarray, seq_len: int, strategy: str | None) -> None:
    """Refuse a loader that would cut an image example: a packer that splits examples across rows,
    or an S below an image example's length (a padded row or a bfd/ffd pack is cut to S).

    Args:
        image_rows: (N,) bool per dataset row: it has images.
        lengths: (N,) tokens of each row.
        seq_len: the loader's S.
        strategy: the packer, or None for padded rows.
    """
    if strategy in SPLITTING:
        raise EtlError(f"packing={strategy!r} cuts examples across rows, and an image's tokens must reach the "
                       "model whole with its pixels: use packing='bfd' or 'ffd' for image data")
    longest = int(lengths[image_rows].max(initial=0))
    if longest > seq_len:
        raise EtlError(f"seq_len={seq_len} would cut an example with images ({longest} tokens); an image's "
                       f"tokens must stay whole: use seq_len >= {longest} (the run's S keeps every example)")


def _zero_based(offsets: np.ndarray) -> np.ndarray:
    return offsets.astype(np.int64) - int(offsets[0])
