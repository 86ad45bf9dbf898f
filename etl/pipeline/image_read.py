"""A chunk's images read from their headers (`etl.images.read`) and sized by the processor's rule
(`etl.images.vision`), per record, before its text is planned (`etl.pipeline.images`).

Each record's images become `IMAGE_DATA` beside its messages (a list of structs: sha256, size,
width, height, grid, tokens, path, location), so every filter of the records keeps them aligned;
records whose images cannot be used are rejected here with a reason.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl import columns as c
from etl.images.read import INLINE, read_images
from etl.images.vision import MAX_RATIO, VisionRule
from etl.images.workers import ImageWorkers

# Reject reasons of a record for its images (etl.images.read gives the reading ones).
NO_PROCESSOR = "unsupported_content"  # images, but the tokenizer folder has no image processor
IMAGE_SIZE = "image_size_refused"  # the processor refuses the image's aspect ratio or size
IMAGES_TOO_LONG = "images_exceed_seq_len"  # the images' tokens alone exceed S
IMAGE_DATA = "image_data"  # a record's images as read (a list of structs), beside its messages
# Images a slice of a chunk's records holds (read, then planned, while the next slice is read): a
# few slices a chunk, so reading overlaps planning at little per-slice planning cost (~0.09 s).
SLICE_IMAGES = 4096
# Image tokens a slice's records are planned with at most (a 16 MiB chunk of text is ~3M tokens:
# docs/design.md, Memory).
IMAGE_TOKENS_PER_SLICE = 1 << 20


def _refs(images: pa.ChunkedArray | pa.Array) -> tuple[list[Any], np.ndarray]:
    """Every record's image references (JSON text -> str or dict) and per record its count."""
    counts = _counts(images)
    flat = pc.list_flatten(images).to_pylist()
    return [json.loads(r) for r in flat], counts  # per image: a file is opened for it anyway


def _first_bad(bad: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per record, the index of its first bad image (-1: none)."""
    owner = np.repeat(np.arange(len(counts)), counts)
    first = np.full(len(counts), -1, np.int64)
    rows = np.flatnonzero(bad)[::-1]  # reversed: the first bad image of a record is written last
    first[owner[rows]] = rows
    return first


def _rejects(good: pa.Table, at: np.ndarray, reason: list[str | None], detail: list[str | None]) -> pa.Table:
    rows = np.flatnonzero(at >= 0)
    return pa.table({c.SOURCE_LINE: good.column(c.SOURCE_LINE).take(rows),
                     c.REASON: pa.array([reason[i] for i in at[rows]], pa.string()),
                     c.DETAIL: pa.array([detail[i] for i in at[rows]], pa.string()),
                     c.RAW: pa.nulls(len(rows), pa.string())})


# One slice of a chunk's records whose images are being read: (its first row and rows, its image
# references, their count per record, and a call that waits for their `read_images` table).
Started = tuple[tuple[int, int], list[Any], np.ndarray, Callable[[], pa.Table]]


def read_chunk_images(good: pa.Table, *, source_path: str, rule: VisionRule | None, root: str | None,
                      embed: bool, seq_len: int, workers: ImageWorkers | None = None,
                      started: list[Started] | None = None) -> Iterator[tuple[pa.Table, pa.Table | None]]:
    """(records kept, rejects or None) of one parsed chunk, in slices of about `SLICE_IMAGES` images;
    the kept records gain `IMAGE_DATA` (each one's images as read: sha256, size, width, height,
    grid, tokens, path, location, and bytes only of images that have no location), so every
    later filter of the records keeps them aligned. A record is rejected for its first image that
    cannot be read or whose size the processor refuses, or when its images alone need more than S
    tokens; without an image processor every record with images is rejected.

    No file's bytes are held here: `--images embed` reads them again part by part when writing
    (`with_bytes`): 16 MiB of JSON can name gigabytes of images (5,000 LLaMA-Factory-style
    conversations: 1.4 GB, which held at once took the run to 3.8 GB peak RSS). `workers`: the
    run's image worker processes (`etl.images.workers`), and `started` what `start_reads` started
    in them for these records; without workers, the images are read on a thread of this process.
    """
    # The references stay beside IMAGE_DATA: the dedup key reads them (etl.ingest.preprocess.IMAGE_KEY).
    images = _images_of(good)
    if images.null_count == len(images):  # a run with an image processor writes its columns all the same
        yield (good if rule is None else good.append_column(IMAGE_DATA, _no_images(good.num_rows))), None
        return
    if rule is None:
        at = np.where(_counts(images) > 0, 0, -1)
        why = ("the record has images, but the tokenizer folder has no preprocessor_config.json: use a "
               "vision-language model's processor folder as --tokenizer")
        yield good.filter(pa.array(at < 0)), _rejects(good, at, [NO_PROCESSOR], [why])
        return
    finish = functools.partial(_read_slice, rule=rule, embed=embed, seq_len=seq_len)
    start = functools.partial(start_reads, images, source_path=source_path, root=root, embed=embed)

    def planned(reads: list[Started]) -> Iterator[tuple[pa.Table, pa.Table | None]]:
        for span, refs, n, read in reads:
            yield from _by_tokens(*finish(good.slice(*span), refs, n, read()))

    if workers is None:  # every slice read on a thread, in turn, while the ones before are planned
        with ThreadPoolExecutor(max_workers=1) as pool:
            yield from planned(start(lambda refs, **how: pool.submit(read_images, refs, **how).result))
        return
    if not started or [s[0] for s in started] != _spans(_counts(images)):  # not these records' reads
        started = start(workers.read)
    yield from planned(started)


def start_reads(images: pa.ChunkedArray, read: Callable[..., Callable[[], pa.Table]], *, source_path: str,
                root: str | None, embed: bool) -> list[Started]:
    """The reads of every slice of some records' images (`images`: their IMAGES column) started by
    `read` (`ImageWorkers.read`, or a thread's); `read_chunk_images` of the same records takes them
    as `started`."""
    base, keep = source_path.rpartition("/")[0] or ".", INLINE if embed else False
    started = []
    for span in _spans(_counts(images)):
        refs, n = _refs(images.slice(*span))
        started.append((span, refs, n, read(refs, base=base, root=root, keep_bytes=keep)))
    return started


def early_reads(source_path: str, parsed: pa.Table, *, root: str | None, embed: bool,
                workers: ImageWorkers) -> list[Started] | None:
    """`start_reads` of a parsed chunk's good records (those `process_chunk` keeps: no reason), on
    the prefetch thread as soon as the chunk is parsed: the workers read its images while the
    chunk before it is planned (and the first chunk's while the tokenizer loads)."""
    images, reason = _images_of(parsed), parsed.column(c.REASON)
    if images.null_count == len(images):
        return None
    if reason.null_count != len(reason):
        images = images.filter(reason.is_null())
    return start_reads(images, workers.read, source_path=source_path, root=root, embed=embed)


def _images_of(table: pa.Table) -> pa.ChunkedArray:
    """The records' IMAGES column (all null where the input has none)."""
    if c.IMAGES in table.column_names:
        return table.column(c.IMAGES)
    return pa.chunked_array([pa.nulls(table.num_rows, pa.list_(pa.string()))])


def _counts(images: pa.ChunkedArray) -> np.ndarray:
    return pc.fill_null(pc.list_value_length(images), 0).to_numpy(zero_copy_only=False).astype(np.int64)


def _spans(counts: np.ndarray) -> list[tuple[int, int]]:
    """(first record, records) of each slice of about SLICE_IMAGES images."""
    bounds = [0, *(np.flatnonzero(np.diff(np.cumsum(counts) // SLICE_IMAGES)) + 1).tolist(), len(counts)]
    return [(a, b - a) for a, b in itertools.pairwise(bounds) if b > a]


def _by_tokens(kept: pa.Table, rejects: pa.Table | None) -> Iterator[tuple[pa.Table, pa.Table | None]]:
    """`kept` in pieces of about `IMAGE_TOKENS_PER_SLICE` image tokens (the rejects with the first):
    a chunk is sized by its JSON, and an image's ~10 bytes of reference stand for up to 16,384 tokens."""
    images = one_array(kept.column(IMAGE_DATA))
    tokens = pc.fill_null(images.values.field("tokens"), 0).to_numpy().astype(np.int64)
    ends = np.concatenate(([0], np.cumsum(tokens)))[images.offsets.to_numpy() - images.offsets[0].as_py()][1:]
    cuts = [0, *(np.flatnonzero(np.diff(ends // IMAGE_TOKENS_PER_SLICE)) + 1).tolist(), kept.num_rows]
    for k, (a, b) in enumerate(itertools.pairwise(cuts)):
        if b > a or k == 0:
            yield kept.slice(a, b - a), rejects if k == 0 else None


def _read_slice(good: pa.Table, refs: list[Any], counts: np.ndarray, read: pa.Table, *, rule: VisionRule,
                embed: bool, seq_len: int) -> tuple[pa.Table, pa.Table | None]:
    """(records kept with `IMAGE_DATA`, rejects or None) of some records, their images `read`
    (`read_images` of `refs`; `counts` per record)."""
    # An image that was not read has no size: 0 (refused by the rule; its reader's reason stands).
    grid, ok = rule.grid(pc.fill_null(read.column("height"), 0).to_numpy(),
                         pc.fill_null(read.column("width"), 0).to_numpy())
    tokens = np.where(ok, rule.tokens(grid), 0).astype(np.int64)
    reason, detail = _reasons(read, refs, ok, rule)
    at = _first_bad(np.asarray([r is not None for r in reason], bool), counts)
    first_of = np.cumsum(counts) - counts
    spans = np.concatenate(([0], np.cumsum(tokens + 2)))
    over = (at < 0) & (counts > 0) & (spans[first_of + counts] - spans[first_of] > seq_len)
    for i in first_of[over]:
        reason[i] = IMAGES_TOO_LONG
        detail[i] = f"the record's images alone need more than S = {seq_len} tokens; raise --seq-len or lower --max-pixels"
    at = np.where(over, first_of, at)
    # `--images reference`: the path is where the image was read, which the loader opens again.
    path = read.column("path" if embed else "location")
    table = read.select(["bytes", "sha256", "size", "width", "height", "location"]).append_column(
        "path", path).append_column("grid", _grid_array(grid)).append_column("tokens", pa.array(tokens, pa.int32()))
    per_record = pa.ListArray.from_arrays(pa.array(np.concatenate(([0], np.cumsum(counts))).astype(np.int32)),
                                          pa.StructArray.from_arrays([col.combine_chunks() for col in table.columns],
                                                                     names=table.column_names))
    keep = pa.array(at < 0)
    kept = good.append_column(IMAGE_DATA, per_record)
    if keep.true_count == len(keep):
        return kept, None
    return kept.filter(keep), _rejects(good, at, reason, detail)


def _reasons(read: pa.Table, refs: list[Any], ok: np.ndarray, rule: VisionRule) -> tuple[list, list]:
    """Per image its reject reason and detail (None: fine): the reader's, else the processor's refusal."""
    reason, detail = read.column("reason").to_pylist(), read.column("detail").to_pylist()
    for i in np.flatnonzero(~ok):
        if reason[i] is None:
            reason[i] = IMAGE_SIZE
            name = refs[i] if isinstance(refs[i], str) and len(refs[i]) < 200 else f"#{i}"
            detail[i] = (f"image {name}: {read['width'][i]}x{read['height'][i]} is refused by {rule.processor} "
                         f"(an aspect ratio over {MAX_RATIO}, or a side under {rule.patch_size * rule.merge_size} "
                         "pixels)")
    return reason, detail


def _no_images(n: int) -> pa.ListArray:
    """`IMAGE_DATA` of n records without images."""
    fields = {"bytes": pa.binary(), "sha256": pa.string(), "size": pa.int64(), "width": pa.int32(),
              "height": pa.int32(), "location": pa.string(), "path": pa.string(), "grid": pa.list_(pa.int32()),
              "tokens": pa.int32()}
    empty = pa.StructArray.from_arrays([pa.array([], t) for t in fields.values()], names=list(fields))
    return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), empty)


def _grid_array(grid: np.ndarray) -> pa.ListArray:
    flat = np.ascontiguousarray(grid, dtype=np.int32).ravel()
    return pa.ListArray.from_arrays(pa.array(np.arange(0, len(flat) + 1, 3, dtype=np.int32)), pa.array(flat))


def one_array(column: pa.ChunkedArray) -> pa.Array:
    """A column as one array (combine_chunks copies even a single chunk's buffers)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
