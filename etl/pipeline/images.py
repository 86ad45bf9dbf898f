"""Images through the pipeline: each chunk's images read from their headers (`etl.images`), their
tokens spliced into the content ids, and the images of the kept turns written with each example.

An image's token count depends only on its height and width (the processor's resize rule,
`etl.images.vision`), so no pixel is decoded here: the loader's workers decode them. A message's
images sit at character offsets into its content (`IMAGE_AT`, from the builder); its content is
tokenized in pieces between them, in the same one batched call as every other text, which gives
the ids `apply_chat_template` gives: the image span's tokens are special, so the tokenizer never
merges text across them.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from etl import columns as c
from etl.images.embed import read_again
from etl.images.read import INLINE, read_images
from etl.images.vision import MAX_RATIO, VisionRule
from etl.ragged import range_gather
from etl.tokens.tokenizer import offsets_to_list_array

# Reject reasons of a record for its images (etl.images.read gives the reading ones).
NO_PROCESSOR = "unsupported_content"  # images, but the tokenizer folder has no image processor
IMAGE_SIZE = "image_size_refused"  # the processor refuses the image's aspect ratio or size
IMAGES_TOO_LONG = "images_exceed_seq_len"  # the images' tokens alone exceed S
IMAGE_CUT = "image_cut"  # drop reason: the truncation policy would cut an image span
IMAGE_STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # HF datasets' `Image`
IMAGE_DATA = "image_data"  # a record's images as read (a list of structs), beside its messages
IMAGE_BASE = "image_base"  # a record's first image in the chunk's flat image table
IMAGE_ROWS = "image_rows"  # an example's kept images, as rows of that table
# Images a slice of a chunk's records holds (read, then planned, while the next slice is read): a
# few slices a chunk, so reading overlaps planning at little per-slice planning cost (~0.09 s).
SLICE_IMAGES = 4096
# Image tokens a slice's records are planned with at most (a 16 MiB chunk of text is ~3M tokens:
# docs/design.md, Memory).
IMAGE_TOKENS_PER_SLICE = 1 << 20
# `--images embed`: image files a `data` part holds, read again when it is written (~4 parts in
# memory at once: the one being filled, and the writer's).
IMAGE_BYTES_PER_PART = 32 << 20


class ImageSpan(NamedTuple):
    """The ids of an image in the token stream: start, `tokens` x pad, end (Qwen2-VL's
    `<|vision_start|>` + `<|image_pad|>`... + `<|vision_end|>`)."""

    start: int
    pad: int
    end: int

    @property
    def ids(self) -> tuple[int, int, int]:
        return (self.start, self.pad, self.end)


def span_of(rule: VisionRule, token_id: Any) -> ImageSpan:
    """The span's ids from the tokenizer's ids of the rule's token strings (`token_id`: str -> id or None)."""
    ids = [token_id(t) for t in (rule.start, rule.image_token, rule.end)]
    if any(i is None for i in ids):
        raise ValueError(f"the tokenizer has no id for {rule.start!r}, {rule.image_token!r} or {rule.end!r}")
    return ImageSpan(*ids)


def _refs(images: pa.ChunkedArray | pa.Array) -> tuple[list[Any], np.ndarray]:
    """Every record's image references (JSON text -> str or dict) and per record its count."""
    counts = pc.fill_null(pc.list_value_length(images), 0).to_numpy(zero_copy_only=False).astype(np.int64)
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


def read_chunk_images(good: pa.Table, *, source_path: str, rule: VisionRule | None, root: str | None,
                      embed: bool, seq_len: int) -> Iterator[tuple[pa.Table, pa.Table | None]]:
    """(records kept, rejects or None) of one parsed chunk, in slices of about `SLICE_IMAGES` images;
    the kept records gain `IMAGE_DATA` (each one's images as read: sha256, size, width, height,
    grid, tokens, path, location, and bytes only of images that have no location), so every
    later filter of the records keeps them aligned. A record is rejected for its first image that
    cannot be read or whose size the processor refuses, or when its images alone need more than S
    tokens; without an image processor every record with images is rejected.

    No file's bytes are held here: `--images embed` reads them again part by part when writing
    (`with_bytes`): 16 MiB of JSON can name gigabytes of images (5,000 LLaMA-Factory-style
    conversations: 1.4 GB, which held at once took the run to 3.8 GB peak RSS).
    """
    # The references stay beside IMAGE_DATA: the dedup key reads them (etl.ingest.preprocess.IMAGE_KEY).
    images = good.column(c.IMAGES) if c.IMAGES in good.column_names else pa.nulls(good.num_rows, pa.list_(pa.string()))
    if images.null_count == len(images):  # a run with an image processor writes its columns all the same
        yield (good if rule is None else good.append_column(IMAGE_DATA, _no_images(good.num_rows))), None
        return
    counts = pc.fill_null(pc.list_value_length(images), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    if rule is None:
        at = np.where(counts > 0, 0, -1)
        why = ("the record has images, but the tokenizer folder has no preprocessor_config.json: use a "
               "vision-language model's processor folder as --tokenizer")
        yield good.filter(pa.array(at < 0)), _rejects(good, at, [NO_PROCESSOR], [why])
        return
    read = functools.partial(_read_slice, base=source_path.rpartition("/")[0] or ".", rule=rule, root=root,
                             embed=embed, seq_len=seq_len)
    ends = np.cumsum(counts)
    bounds = [0, *(np.flatnonzero(np.diff(ends // SLICE_IMAGES)) + 1).tolist(), len(counts)]
    spans = [(a, b - a) for a, b in itertools.pairwise(bounds) if b > a]
    # The next slice is read on a thread while this one is planned and written: reading and hashing
    # release the GIL.
    with ThreadPoolExecutor(max_workers=1) as pool:
        ahead = [pool.submit(read, good.slice(*spans[0]), images.slice(*spans[0]))]
        for k in range(len(spans)):
            if k + 1 < len(spans):
                ahead.append(pool.submit(read, good.slice(*spans[k + 1]), images.slice(*spans[k + 1])))
            kept, rejects = ahead.pop(0).result()
            yield from _by_tokens(kept, rejects)


def _by_tokens(kept: pa.Table, rejects: pa.Table | None) -> Iterator[tuple[pa.Table, pa.Table | None]]:
    """`kept` in pieces of about `IMAGE_TOKENS_PER_SLICE` image tokens (the rejects with the first):
    a chunk is sized by its JSON, and an image's ~10 bytes of reference stand for up to 16,384 tokens."""
    images = _single(kept.column(IMAGE_DATA))
    tokens = pc.fill_null(images.values.field("tokens"), 0).to_numpy().astype(np.int64)
    ends = np.concatenate(([0], np.cumsum(tokens)))[images.offsets.to_numpy() - images.offsets[0].as_py()][1:]
    cuts = [0, *(np.flatnonzero(np.diff(ends // IMAGE_TOKENS_PER_SLICE)) + 1).tolist(), kept.num_rows]
    for k, (a, b) in enumerate(itertools.pairwise(cuts)):
        if b > a or k == 0:
            yield kept.slice(a, b - a), rejects if k == 0 else None


def _read_slice(good: pa.Table, images: pa.ChunkedArray, *, base: str, rule: VisionRule, root: str | None,
                embed: bool, seq_len: int) -> tuple[pa.Table, pa.Table | None]:
    """(records kept with `IMAGE_DATA`, rejects or None) of some records."""
    refs, counts = _refs(images)
    read = read_images(refs, base=base, root=root, keep_bytes=INLINE if embed else False)
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


def record_images(good: pa.Table) -> list[pl.Series]:
    """The records frame's image columns from `IMAGE_DATA`, without the bytes (they stay in Arrow, never
    copied into Polars): each record's images' token counts (`IMAGE_TOKENS`) and its first image's row
    in the chunk's flat image table (`IMAGE_BASE`, `flat_images`)."""
    images = _single(good.column(IMAGE_DATA))
    tokens = pa.ListArray.from_arrays(images.offsets, images.values.field("tokens"))
    base = images.offsets.to_numpy()[:-1] - images.offsets[0].as_py()
    return [pl.Series(c.IMAGE_TOKENS, tokens), pl.Series(IMAGE_BASE, base.astype(np.int64))]


def _single(column: pa.ChunkedArray) -> pa.Array:
    """A column as one array (combine_chunks copies even a single chunk's buffers)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def flat_images(good: pa.Table) -> pa.StructArray:
    """Every image of the chunk's records in record order (`IMAGE_BASE` indexes it)."""
    images = _single(good.column(IMAGE_DATA))
    return images.values.slice(images.offsets[0].as_py(), images.offsets[-1].as_py() - images.offsets[0].as_py())


def turn_images(turns: pl.LazyFrame) -> pl.LazyFrame:
    """Each turn's images: `IMAGE_FIRST` (its first image's index in the record's list) and
    `IMAGE_TOKENS` (the token count of each), from the record's list and the turns' offsets."""
    count = pl.col(c.IMAGE_AT).list.len().fill_null(0).cast(pl.Int32)
    first = (count.cum_sum() - count).over(c.CONV)
    return turns.with_columns(first.alias(c.IMAGE_FIRST)).with_columns(
        pl.col(c.IMAGE_TOKENS).list.slice(pl.col(c.IMAGE_FIRST), count).alias(c.IMAGE_TOKENS))


def encode_with_images(encode: Any, texts: pl.Series, at: pl.Series, tokens: pl.Series,
                       span: ImageSpan) -> pa.LargeListArray:
    """Ids of each text with its images spliced in at their character offsets (`at`, sorted; `tokens`:
    pads per image): the pieces between images are encoded in one batched call, then one gather
    interleaves pieces and image spans (no per-row Python). Texts without images are one piece."""
    k = at.list.len().fill_null(0).to_numpy().astype(np.int64)
    if not k.any():
        return encode(texts.to_arrow())
    row = np.repeat(np.arange(len(k)), k)
    size = texts.str.len_chars().fill_null(0).to_numpy().astype(np.int64)
    cuts = np.clip(at.explode(empty_as_null=False).drop_nulls().to_numpy().astype(np.int64), 0, size[row])
    # Piece j of a row runs from its cut j - 1 (0 for the first) to its cut j (the text's end for the last).
    piece_row = np.repeat(np.arange(len(k)), k + 1)
    lo = np.zeros(len(piece_row), np.int64)
    hi = size[piece_row].copy()
    first = np.cumsum(k + 1) - (k + 1)
    after = np.ones(len(piece_row), bool)
    after[first] = False  # every piece but a row's first starts at a cut
    lo[after] = cuts
    before = np.ones(len(piece_row), bool)
    before[first + k] = False  # every piece but a row's last ends at a cut
    hi[before] = cuts
    pieces = pl.DataFrame({"t": texts.gather(piece_row), "lo": lo, "n": hi - lo}).select(
        pl.col("t").str.slice(pl.col("lo"), pl.col("n")))["t"]
    pads = tokens.explode(empty_as_null=False).drop_nulls().to_numpy()
    return _interleave(encode(pieces.to_arrow()), k, pads, span)


def _interleave(pieces: pa.LargeListArray, k: np.ndarray, pads: np.ndarray, span: ImageSpan) -> pa.LargeListArray:
    """Row i: piece 0, image 0, piece 1, ..., piece k[i] (k[i] + 1 pieces, k[i] images)."""
    offsets = pieces.offsets.to_numpy()
    values = pieces.values.to_numpy(zero_copy_only=False).astype(np.int32)
    piece_len = np.diff(offsets)
    image_len = pads.astype(np.int64) + 2
    image_start = np.cumsum(image_len) - image_len
    image_ids = np.full(int(image_len.sum()), span.pad, np.int32)
    image_ids[image_start] = span.start
    image_ids[image_start + image_len - 1] = span.end
    # Interleaved order: each row's pieces and images alternate, a piece first and last.
    n_items = 2 * k + 1
    item_row_first = np.cumsum(n_items) - n_items
    is_image = np.ones(int(n_items.sum()), bool)
    piece_slot = item_row_first[np.repeat(np.arange(len(k)), k + 1)] + 2 * _ranks(k + 1)
    is_image[piece_slot] = False
    start = np.empty(len(is_image), np.int64)
    length = np.empty(len(is_image), np.int64)
    start[~is_image], length[~is_image] = offsets[:-1], piece_len
    start[is_image], length[is_image] = image_start + len(values), image_len
    flat = np.concatenate((values, image_ids))[range_gather(start, length)]
    row_len = np.add.reduceat(length, item_row_first) if len(k) else np.zeros(0, np.int64)
    return offsets_to_list_array(flat, np.concatenate(([0], np.cumsum(row_len))).astype(np.int64))


def _ranks(counts: np.ndarray) -> np.ndarray:
    """0..counts[i]-1 for every i, concatenated."""
    return np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)


def example_images(records: pl.DataFrame, plan: pl.DataFrame) -> pl.DataFrame:
    """Per conversation (`CONV`) the images of its kept turns, in order, as rows of the chunk's flat
    image table (`IMAGE_ROWS`), `NUM_IMAGE_TOKENS`, and `IMAGE_CUT` as its `DROP_REASON` where the
    hard cut falls inside a turn with images (its `images` would name an image whose tokens are cut)."""
    count = pl.col(c.IMAGE_AT).list.len().fill_null(0)
    with_images = plan.filter(pl.col(c.KEPT) & (count > 0)).join(
        records.select(c.CONV, IMAGE_BASE), on=c.CONV, how="left", maintain_order="left")
    first = pl.col(IMAGE_BASE) + pl.col(c.IMAGE_FIRST)
    kept = (with_images.select(c.CONV, pl.int_ranges(first, first + count, dtype=pl.Int64).alias(IMAGE_ROWS),
                               pl.col(c.IMAGE_TOKENS).list.sum().alias("n"))  # the turn's own images
            .group_by(c.CONV, maintain_order=True)
            .agg(pl.col(IMAGE_ROWS).list.explode(keep_nulls=False, empty_as_null=False),
                 pl.col("n").sum().cast(pl.Int32).alias(c.NUM_IMAGE_TOKENS)))
    cut = (with_images.filter((pl.col(c.END) - pl.col(c.START)) < pl.col(c.TURN_LEN))
           .select(pl.col(c.CONV).unique(), pl.lit(IMAGE_CUT).alias(c.DROP_REASON)))
    return (records.select(c.CONV).join(kept, on=c.CONV, how="left", maintain_order="left")
            .with_columns(pl.col(IMAGE_ROWS).fill_null([]), pl.col(c.NUM_IMAGE_TOKENS).fill_null(0))
            .join(cut, on=c.CONV, how="left", maintain_order="left"))


def image_parts(rows: pa.Table, flat: pa.StructArray, *, embed: bool) -> Iterator[pa.Table]:
    """`rows` (written examples with `IMAGE_ROWS`) as `data` parts with their image columns; with
    `embed`, parts of about `IMAGE_BYTES_PER_PART` of image files, each file read again (and its
    sha256 checked against the first read) only when its part is written."""
    at = _single(rows.column(IMAGE_ROWS))
    if not embed or len(at) == 0:
        yield _image_columns(rows, flat, at, embed=False)
        return
    sizes = pc.fill_null(flat.field("size"), 0).to_numpy()
    ends = np.concatenate(([0], np.cumsum(sizes[at.values.to_numpy()])))[at.offsets.to_numpy() - at.offsets[0].as_py()]
    cuts = [0, *(np.flatnonzero(np.diff(ends[1:] // IMAGE_BYTES_PER_PART)) + 1).tolist(), len(at)]
    for a, b in itertools.pairwise(cuts):
        if b > a:
            yield _image_columns(rows.slice(a, b - a), flat, at.slice(a, b - a), embed=True)


def _image_columns(rows: pa.Table, flat: pa.StructArray, at: pa.ListArray, *, embed: bool) -> pa.Table:
    """`rows` with their images' columns (`at`: their rows of `flat`)."""
    which = at.values.slice(at.offsets[0].as_py(), at.offsets[-1].as_py() - at.offsets[0].as_py())
    taken = flat.take(which)  # no image bytes but inline ones: a cheap copy
    offsets = pa.array(at.offsets.to_numpy() - at.offsets[0].as_py(), pa.int32())
    sizes = pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * len(taken) + 1, 2, dtype=np.int32)), pa.array(
        np.stack([taken.field("width").to_numpy(zero_copy_only=False),
                  taken.field("height").to_numpy(zero_copy_only=False)], axis=1).ravel(), pa.int32()))
    data = _with_bytes(taken) if embed else taken.field("bytes")
    lists = {c.IMAGES: pa.StructArray.from_arrays([data, taken.field("path")], names=["bytes", "path"]),
             c.IMAGE_SHA256: taken.field("sha256"), c.IMAGE_SIZES: sizes, c.IMAGE_GRID_THW: taken.field("grid")}
    for name, values in lists.items():
        rows = rows.append_column(name, pa.ListArray.from_arrays(offsets, values))
    return rows


def _with_bytes(images: pa.StructArray) -> pa.Array:
    """The images' bytes: those kept when read (data URIs, bytes), the others read again from their
    location (`etl.images.read.read_again`: a file whose sha256 changed since stops the run)."""
    located = images.field("location").is_valid()
    if not pc.any(located).as_py():
        return images.field("bytes")
    again = read_again(*(pc.filter(images.field(f), located).to_pylist() for f in ("location", "sha256", "size")))
    if located.true_count == len(located):  # the usual part: every image has a file (no copy)
        return again
    index = np.cumsum(located.to_numpy(zero_copy_only=False)) - 1  # each located image's row of `again`
    return pc.if_else(located, again.take(pa.array(np.maximum(index, 0))), images.field("bytes"))


def with_images(examples: pl.DataFrame, images: pl.DataFrame) -> pl.DataFrame:
    """`examples` with their image columns (`example_images`), its drop reason first."""
    return (examples.join(images.rename({c.DROP_REASON: "image_drop"}), on=c.CONV, how="left", maintain_order="left")
            .with_columns(pl.coalesce(c.DROP_REASON, "image_drop").alias(c.DROP_REASON)).drop("image_drop"))
