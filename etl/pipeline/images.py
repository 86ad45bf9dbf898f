"""Images through the pipeline once read (`etl.pipeline.image_read`): their tokens spliced into the
content ids, and the images of the kept turns written with each example.

An image's token count depends only on its height and width (the processor's resize rule,
`etl.images.vision`), so no pixel is decoded here: the loader's workers decode them. A message's
images sit at character offsets into its content (`IMAGE_AT`, from the builder); its content is
tokenized in pieces between them, in the same one batched call as every other text, which gives
the ids `apply_chat_template` gives: the image span's tokens are special, so the tokenizer never
merges text across them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from etl import columns as c
from etl.images.embed import read_again
from etl.images.vision import VisionRule
from etl.pipeline.image_read import IMAGE_DATA, one_array
from etl.ragged import range_gather
from etl.tokens.tokenizer import offsets_to_list_array

IMAGE_CUT = "image_cut"  # drop reason: the truncation policy would cut an image span
IMAGE_BASE = "image_base"  # a record's first image in the chunk's flat image table
IMAGE_ROWS = "image_rows"  # an example's kept images, as rows of that table
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


def record_images(good: pa.Table) -> list[pl.Series]:
    """The records frame's image columns from `IMAGE_DATA`, without the bytes (they stay in Arrow, never
    copied into Polars): each record's images' token counts (`IMAGE_TOKENS`) and its first image's row
    in the chunk's flat image table (`IMAGE_BASE`, `flat_images`)."""
    images = one_array(good.column(IMAGE_DATA))
    tokens = pa.ListArray.from_arrays(images.offsets, images.values.field("tokens"))
    base = images.offsets.to_numpy()[:-1] - images.offsets[0].as_py()
    return [pl.Series(c.IMAGE_TOKENS, tokens), pl.Series(IMAGE_BASE, base.astype(np.int64))]


def flat_images(good: pa.Table) -> pa.StructArray:
    """Every image of the chunk's records in record order (`IMAGE_BASE` indexes it)."""
    images = one_array(good.column(IMAGE_DATA))
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
    at = one_array(rows.column(IMAGE_ROWS))
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
