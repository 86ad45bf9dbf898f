"""Turn contents to token ids, a stage of `etl.pipeline.stages.plan_turns` (`LazyFrame ->
LazyFrame`): one batched tokenizer call per chunk, each content with the template text it touches
(`etl.pipeline.joins`)."""

from __future__ import annotations

import numpy as np
import polars as pl

from etl.columns import (
    CONTENT,
    CONTENT_IDS,
    CONTENT_LEN,
    FORM,
    IMAGE_AT,
    IMAGE_TOKENS,
    INJECTED,
    REASONING,
    REASONING_IDS,
    REASONING_LEN,
    ROLE,
)
from etl.pipeline.images import ImageSpan, encode_with_images
from etl.pipeline.joins import (
    JOIN_KEY,
    LEAD_TRIM,
    TRAIL_TRIM,
    join_key,
    run_offsets,
    run_texts,
    split_runs,
)
from etl.pipeline.reasoning import NO_WRAP, Encoder, ReasoningRender, encode_wrapped
from etl.tokens.templates import TemplateIds
from etl.tokens.tool_format import FORMS, WITH_TOOLS


def tokenize_contents(
    turns: pl.LazyFrame, *, encode: Encoder, template: TemplateIds, system_ids: list[int],
    reasoning: ReasoningRender = NO_WRAP, span: ImageSpan | None = None,
) -> pl.LazyFrame:
    """Content -> ids in one batched tokenizer call, and `CONTENT_LEN`.

    Each content is tokenized with the template text that touches it (`etl.pipeline.joins`), so
    the turn's ids are those of the whole rendered conversation; `LEAD_TRIM` / `TRAIL_TRIM` say
    how many header / end ids a token straddling a join took over.

    An injected system turn keeps its empty content's (empty) ids: its `CONTENT_LEN` counts
    the `system_ids`, which `etl.pipeline.assemble` takes from a constant buffer. Splicing them in per
    row (`when/then/otherwise` over the list column) copied every id of the chunk twice: 2 x 88
    MB for one 22 MB message with the byte tokenizer (bench/big_record.py).
    """
    ids_type = pl.List(pl.Int32)
    split_type = pl.Struct({CONTENT_IDS: ids_type, LEAD_TRIM: pl.Int32, TRAIL_TRIM: pl.Int32})

    images = span is not None and IMAGE_AT in turns.collect_schema()

    def encode_runs(runs: pl.Series) -> pl.Series:
        parts = runs.struct.unnest()
        ids = (encode_with_images(encode, parts[CONTENT], parts[IMAGE_AT], parts[IMAGE_TOKENS], span)
               if images and span is not None else encode(parts[CONTENT].to_arrow()))
        content, lead_trim, trail_trim = split_runs(ids, parts[JOIN_KEY].to_numpy().astype(np.int64), template)
        return pl.DataFrame({CONTENT_IDS: pl.Series(content, dtype=ids_type),
                             LEAD_TRIM: lead_trim.astype(np.int32),
                             TRAIL_TRIM: trail_trim.astype(np.int32)}).to_struct(CONTENT_IDS)

    def encode_reasoning(texts: pl.Series) -> pl.Series:
        ids = encode_wrapped(encode, texts.to_arrow(), reasoning.prefix, reasoning.suffix)
        return pl.Series(REASONING_IDS, ids, dtype=ids_type)

    key = join_key(role_number(template.role_table()), template)
    image_fields = [run_offsets(pl.col(JOIN_KEY), template).alias(IMAGE_AT), pl.col(IMAGE_TOKENS)] if images else []
    return (
        turns.with_columns(key.alias(JOIN_KEY))
        .with_columns(
            pl.struct(run_texts(pl.col(JOIN_KEY), template).alias(CONTENT), pl.col(JOIN_KEY), *image_fields)
            .map_batches(encode_runs, return_dtype=split_type).alias(CONTENT_IDS),
            pl.col(REASONING).map_batches(encode_reasoning, return_dtype=ids_type).alias(REASONING_IDS),
        )
        .unnest(CONTENT_IDS)
        .with_columns(
            pl.when(pl.col(INJECTED) & (pl.col(FORM) != WITH_TOOLS))
            .then(pl.lit(len(system_ids), dtype=pl.Int32))
            .otherwise(pl.col(CONTENT_IDS).list.len().cast(pl.Int32))
            .alias(CONTENT_LEN),
            pl.col(REASONING_IDS).list.len().cast(pl.Int32).alias(REASONING_LEN),
        )
        .drop(CONTENT, JOIN_KEY)
    )


def role_number(role_table: pl.DataFrame) -> pl.Expr:
    """Each turn's row in the role table: FORMS rows per role, in the table's role order."""
    roles = role_table[ROLE].unique(maintain_order=True)
    return pl.col(ROLE).replace_strict(
        roles, pl.Series(range(0, FORMS * len(roles), FORMS)), default=None, return_dtype=pl.UInt32
    ) + pl.col(FORM).cast(pl.UInt32)
