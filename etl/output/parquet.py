"""Write output tables as Parquet with fixed schemas, temp names and renames.

Fixed Arrow schemas make the files independent of how Polars happened to type a column,
which, with no timestamps in the files, is what makes two runs byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from etl import columns as c
from etl.kinds import PREFERENCE, SFT, UNPAIRED
from etl.output.ownership import tmp_of

# 1,024 examples per row group: at chat-typical ~500 tokens that is ~2.5 MB of ids+mask, read
# in a few ms (docs/design.md, Measured costs), small
# enough for a per-worker cache of a few groups and large enough that a shuffled batch of 32
# costs few group reads.
ROW_GROUP_SIZE = 1024

# Key-value metadata of every part: the id of the run that wrote it, the manifest's
# `run_id` (a pack index part: its `etl pack`'s, `_packs.json`'s), and on a pack index part the
# run whose data it indexes. Readers compare them from the footer they read anyway (no extra read),
# so a valid part of another run copied over one is refused even where no sha256 is compared.
_PREFIX = "etl."
RUN_ID_KEY = _PREFIX + c.RUN_ID
DATA_RUN_ID_KEY = _PREFIX + c.DATA_RUN_ID

DATA_SCHEMA = pa.schema(
    [
        (c.ID, pa.string()),
        (c.SOURCE_FILE, pa.string()),
        (c.SOURCE_LINE, pa.int64()),
        (c.DOMAIN, pa.string()),
        (c.SPLIT, pa.string()),
        (c.INPUT_IDS, pa.list_(pa.int32())),
        (c.LOSS_MASK, pa.list_(pa.bool_())),
        (c.NUM_TOKENS, pa.int32()),
        (c.NUM_TRAINED, pa.int32()),
        (c.NUM_TURNS, pa.int32()),
        (c.NUM_TURNS_DROPPED, pa.int32()),
        (c.TRUNCATED, pa.bool_()),
        (c.ASSISTANT_MASKS, pa.list_(pa.bool_())),  # = loss_mask, for TRL (etl.columns)
    ]
)


_COMMON = [(c.ID, pa.string()), (c.SOURCE_FILE, pa.string()), (c.SOURCE_LINE, pa.int64()), (c.DOMAIN, pa.string()),
           (c.SPLIT, pa.string())]
_IDS, _MASK = pa.list_(pa.int32()), pa.list_(pa.bool_())
_TAIL = [(c.NUM_TURNS, pa.int32()), (c.NUM_TURNS_DROPPED, pa.int32()), (c.TRUNCATED, pa.bool_())]
# One row per preference pair / unpaired completion (the manifest's `kind`; etl.columns names them).
PAIR_SCHEMA = pa.schema(_COMMON + [
    (c.PROMPT_IDS, _IDS), (c.CHOSEN_IDS, _IDS), (c.REJECTED_IDS, _IDS), (c.CHOSEN_MASK, _MASK),
    (c.REJECTED_MASK, _MASK), (c.NUM_PROMPT_TOKENS, pa.int32()), (c.NUM_CHOSEN_TOKENS, pa.int32()),
    (c.NUM_REJECTED_TOKENS, pa.int32()), (c.NUM_TOKENS, pa.int32()), (c.NUM_TRAINED, pa.int32()),
    (c.SCORE_CHOSEN, pa.float64()),
    (c.SCORE_REJECTED, pa.float64())] + _TAIL)
UNPAIRED_SCHEMA = pa.schema(_COMMON + [
    (c.PROMPT_IDS, _IDS), (c.COMPLETION_IDS, _IDS), (c.COMPLETION_MASK, _MASK), (c.NUM_PROMPT_TOKENS, pa.int32()),
    (c.NUM_COMPLETION_TOKENS, pa.int32()), (c.NUM_TOKENS, pa.int32()), (c.NUM_TRAINED, pa.int32()),
    (c.LABEL, pa.bool_())] + _TAIL)
# The `data` schema of each kind (etl.kinds.KINDS); SFT with loss weights: data_schema(weights=True).
KIND_SCHEMAS = {SFT: DATA_SCHEMA, PREFERENCE: PAIR_SCHEMA, UNPAIRED: UNPAIRED_SCHEMA}


# What a run with an image processor adds (etl.pipeline.images): HF datasets' `Image` structs, so
# `load_dataset(DST)` gives PIL images; each image's sha256, [width, height] and [t, h, w] grid; the
# image tokens.
IMAGE_FIELDS = [
    pa.field(c.IMAGES, pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))),
    pa.field(c.IMAGE_SHA256, pa.list_(pa.string())),
    pa.field(c.IMAGE_SIZES, pa.list_(pa.list_(pa.int32()))),
    pa.field(c.IMAGE_GRID_THW, pa.list_(pa.list_(pa.int32()))),
    pa.field(c.NUM_IMAGE_TOKENS, pa.int32()),
]


def data_schema(*, weights: bool, images: bool = False) -> pa.Schema:
    """The `data` schema; with per-message weights it gains `loss_weight` list<float32>, with images
    `IMAGE_FIELDS`."""
    fields = [*DATA_SCHEMA, *([pa.field(c.LOSS_WEIGHT, pa.list_(pa.float32()))] if weights else []),
              *(IMAGE_FIELDS if images else [])]
    return pa.schema(fields)


def data_table(examples: pa.Table, *, weights: bool, images: bool = False) -> pa.Table:
    """A `data` part of assembled examples: `assistant_masks` is `loss_mask` itself (zero copy)."""
    masks = examples.append_column(c.ASSISTANT_MASKS, examples.column(c.LOSS_MASK))
    return conform(masks, data_schema(weights=weights, images=images))


TURNS_SCHEMA = pa.schema(
    [
        (c.ID, pa.string()),
        (c.TURN_INDEX, pa.int32()),
        (c.ROLE, pa.string()),
        (c.START, pa.int32()),
        (c.END, pa.int32()),
        (c.NUM_TOKENS, pa.int32()),
        (c.TRAINED, pa.bool_()),
        (c.KEPT, pa.bool_()),
        (c.INJECTED, pa.bool_()),
    ]
)
REJECTS_SCHEMA = pa.schema(
    [
        (c.SOURCE_FILE, pa.string()),
        (c.SOURCE_LINE, pa.int64()),
        (c.REASON, pa.string()),
        (c.DETAIL, pa.string()),
        (c.RAW, pa.string()),
    ]
)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Select and cast the schema's columns in its order (extra columns are dropped)."""
    return pa.table([table.column(f.name).cast(f.type) for f in schema], schema=schema)


def identity_of(body: Any) -> str:
    """A run id: 16 hex digits (64 bits) of a sha256 over `body` as sorted JSON, the inputs and
    settings that fix what a run or a pack writes, so a rerun of the same gets the same id."""
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def identity_keys(run_id: str, *, data_run_id: str | None = None) -> dict[str, str]:
    """The key-value metadata `write_part` stamps on a part of run `run_id` (of a pack index
    over run `data_run_id`'s data)."""
    keys = {RUN_ID_KEY: run_id}
    return keys if data_run_id is None else {**keys, DATA_RUN_ID_KEY: data_run_id}


def part_identity(meta: pq.FileMetaData) -> dict[str, str]:
    """The identity keys (`etl.*`) of a part's key-value metadata, from a footer already read."""
    kv = meta.metadata or {}
    prefix = _PREFIX.encode()
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in kv.items() if k.startswith(prefix)}


# Hugging Face datasets reads a column's feature from this footer key where its Arrow type matches
# (`Features.from_arrow_schema`): `images` then loads as a list of PIL images, not of structs.
HF_FEATURES_KEY = "huggingface"
_HF_IMAGES = {c.IMAGES: {"feature": {"_type": "Image"}, "_type": "List"}}


# Image files are compressed already (JPEG, PNG): zstd over them cost ~3x the write's time (0.47 vs
# 0.16 s per 200 MB of scikit-image's PNGs and LLaMA-Factory's JPEGs) to save 16% of their bytes.
# Nor do they get min/max statistics, which no reader uses and which cost 0.63 vs 0.23 s per 236 MB.
_STORED = f"{c.IMAGES}.list.element.bytes"


def _compression(schema: pa.Schema) -> str | dict[str, str]:
    """zstd, except on the image bytes column (a per-leaf dict names every leaf, or pyarrow's default
    codec takes the ones left out)."""
    if c.IMAGES not in schema.names:
        return "zstd"
    return {path: "none" if path == _STORED else "zstd" for path in _leaves(schema)}


def _leaves(schema: pa.Schema) -> list[str]:
    """Parquet's dotted paths of every leaf column (`x.list.element`, `s.field`)."""
    def walk(name: str, t: pa.DataType) -> list[str]:
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            return walk(f"{name}.list.element", t.value_type)
        if pa.types.is_struct(t):
            return [leaf for f in t for leaf in walk(f"{name}.{f.name}", f.type)]
        return [name]
    return [leaf for f in schema for leaf in walk(f.name, f.type)]


def hf_features(schema: pa.Schema) -> dict[str, str]:
    """The footer's `huggingface` key for a `data` part with images; {} otherwise."""
    return {HF_FEATURES_KEY: json.dumps({"info": {"features": _HF_IMAGES}})} if c.IMAGES in schema.names else {}


def write_part(table: pa.Table, path: Path, *, identity: Mapping[str, str],
               row_group_size: int = ROW_GROUP_SIZE) -> Path:
    """Write one part file atomically: temp name in the same folder, then rename.

    Pages carry CRC32 checksums (a small share of the write time), so readers that verify them (the
    loader, inspect, export) notice a part changed on disk after the manifest listed it.
    `identity` (`identity_keys`) replaces the table's key-value metadata: the footer then names
    the run that wrote it, ~40 bytes per part.
    """
    assert identity and all(k.startswith(_PREFIX) for k in identity), identity
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_of(path)
    pq.write_table(
        table.replace_schema_metadata(dict(identity) | hf_features(table.schema)),
        tmp,
        row_group_size=row_group_size,
        compression=_compression(table.schema),
        # Dictionary-encode the repetitive strings only: token ids have vocab-sized
        # dictionaries that overflow and fall back anyway, at a cost.
        use_dictionary=[f.name for f in table.schema if pa.types.is_string(f.type)],
        write_statistics=True if c.IMAGES not in table.schema.names else [
            leaf for leaf in _leaves(table.schema) if leaf != _STORED],
        store_schema=True,
        write_page_checksum=True,
    )
    os.replace(tmp, path)
    return path
