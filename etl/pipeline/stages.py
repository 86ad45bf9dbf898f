"""Pipeline stages over per-turn rows: each is a function `LazyFrame -> LazyFrame` that never collects.

Turn rows carry `conv` (the conversation's row number in its chunk) and `turn_index`; every
per-conversation quantity is a window expression `.over(CONV)`. The output of `plan_turns`
is one row per turn with its piece lengths, training flags, whole-turn keep decision and the
hard-cut window (`etl.pipeline.truncation`), which `etl.pipeline.assemble` turns into token
lists with numpy. Column names live in `etl.columns`.
"""

from __future__ import annotations

import polars as pl

from etl.columns import (
    CALLS,
    CALLS_LEN,
    CONTENT,
    CONTENT_LEN,
    CONV,
    CUT,
    END,
    END_IDS,
    END_LEN,
    HEADER_IDS,
    HEADER_LEN,
    IMAGE_AT,
    IMAGE_TOKENS,
    INJECTED,
    KEEP_WHOLE,
    KEPT,
    MSG_TRAIN,
    MSG_WEIGHT,
    POS,
    REASONING,
    REASONING_IDS,
    REASONING_LEN,
    ROLE,
    SEP_IDS,
    SEP_LEN,
    START,
    TOOLS,
    TOOLS_TEXT,
    TRAIN_CONTENT,
    TRAIN_END,
    TRAIN_HEADER,
    TRAIN_REASONING,
    TRAINED,
    TURN_INDEX,
    TURN_LEN,
    UNIT,
    WINDOW,
)
from etl.config.run_config import MaskOptions
from etl.pipeline.images import ImageSpan, turn_images
from etl.pipeline.joins import LEAD_TRIM, TRAIL_TRIM
from etl.pipeline.reasoning import NO_WRAP, Encoder, ReasoningRender, keep_reasoning
from etl.pipeline.tools import glue_texts, mark_forms, tokenize_calls, tools_text
from etl.pipeline.truncation import plan_truncation
from etl.pipeline.turn_ids import role_number, tokenize_contents
from etl.tokens.templates import TemplateIds
from etl.tokens.tool_format import ToolIds


def _explode_turns(records: pl.LazyFrame) -> pl.LazyFrame:
    """One row per message: (conv, turn_index, role, content, train, weight, injected=False).

    `train` / `weight` are the message's own overrides (null when it sets none).
    """
    fields = records.collect_schema()["messages"].inner.fields  # type: ignore[attr-defined]
    names = {f.name for f in fields}
    train = (
        pl.col(MSG_TRAIN) if MSG_TRAIN in names else pl.lit(None, dtype=pl.Boolean).alias(MSG_TRAIN)
    )
    weight = (
        pl.col(MSG_WEIGHT)
        if MSG_WEIGHT in names
        else pl.lit(None, dtype=pl.Float64).alias(MSG_WEIGHT)
    )
    reasoning = pl.col(REASONING) if REASONING in names else pl.lit(None, dtype=pl.String).alias(REASONING)
    calls = pl.col(CALLS) if CALLS in names else pl.lit(None, dtype=pl.List(pl.String)).alias(CALLS)
    tools = pl.col(TOOLS_TEXT) if TOOLS_TEXT in records.collect_schema() else pl.lit(None, dtype=pl.String)
    images = IMAGE_TOKENS in records.collect_schema()
    return (
        records.select(
            pl.col(CONV),
            pl.col("messages"),
            tools.alias(TOOLS_TEXT),
            *([pl.col(IMAGE_TOKENS)] if images else []),
            pl.int_ranges(0, pl.col("messages").list.len(), dtype=pl.Int32).alias(TURN_INDEX),
        )
        .explode(["messages", TURN_INDEX])
        .unnest("messages")
        .select(
            CONV,
            TURN_INDEX,
            ROLE,
            CONTENT,
            train.cast(pl.Boolean),
            weight.cast(pl.Float64),
            reasoning.cast(pl.String),
            calls.cast(pl.List(pl.String)),
            pl.lit(False).alias(INJECTED),
            TOOLS_TEXT,
            # (text and transcript messages have no image_at: their records never hold images)
            *([(pl.col(IMAGE_AT) if IMAGE_AT in names else pl.lit(None)).cast(pl.List(pl.Int32)).alias(IMAGE_AT),
               IMAGE_TOKENS] if images else []),
        )
        # The tool list belongs to the system turn only (etl.pipeline.tools).
        .with_columns(pl.when(pl.col(TURN_INDEX) == 0).then(pl.col(TOOLS_TEXT)).alias(TOOLS_TEXT))
    )


def _add_default_system(turns: pl.LazyFrame, *, enabled: bool, tools: bool = False) -> pl.LazyFrame:
    """Default system turn: a conversation without a leading system turn gets one (content filled later).

    With `tools` (the template renders tool lists) a conversation with tools and no system turn
    gets one too, holding the list (`etl.pipeline.tools.glue_texts`).
    """
    if not (enabled or tools):
        return turns
    needs = (pl.col(TURN_INDEX) == 0) & (pl.col(ROLE) != "system")
    if not enabled:
        needs = needs & pl.col(TOOLS_TEXT).is_not_null()
    missing = turns.filter(needs).select(
        pl.col(CONV),
        pl.lit(-1, dtype=pl.Int32).alias(TURN_INDEX),
        pl.lit("system").alias(ROLE),
        pl.lit("").alias(CONTENT),
        pl.lit(None, dtype=pl.Boolean).alias(MSG_TRAIN),
        pl.lit(None, dtype=pl.Float64).alias(MSG_WEIGHT),
        pl.lit(None, dtype=pl.String).alias(REASONING),
        pl.lit(None, dtype=pl.List(pl.String)).alias(CALLS),
        pl.lit(True).alias(INJECTED),
        pl.col(TOOLS_TEXT),
        *([pl.lit(None, dtype=pl.List(pl.Int32)).alias(IMAGE_AT), pl.lit([], dtype=pl.List(pl.Int32))
           .alias(IMAGE_TOKENS)] if IMAGE_AT in turns.collect_schema() else []),
    )
    return (
        pl.concat([turns.with_columns(pl.when(~needs).then(pl.col(TOOLS_TEXT)).alias(TOOLS_TEXT)), missing],
                  how="vertical")
        .sort([CONV, TURN_INDEX])
        .with_columns(pl.int_range(pl.len(), dtype=pl.Int32).over(CONV).alias(TURN_INDEX))
    )


def _attach_template(turns: pl.LazyFrame, role_table: pl.DataFrame) -> pl.LazyFrame:
    """Give each turn the header/end/separator ids of its role and form, and piece lengths.

    A gather from the few-row role table by role number, not a join: a join gathers every
    column of the turns again, the content ids included (one more copy of all of them). A token
    that straddles a join (`etl.pipeline.joins`) is taken off the header (or the think block
    before the content) and the end.
    """
    pieces = {HEADER_IDS: HEADER_LEN, END_IDS: END_LEN, SEP_IDS: SEP_LEN}
    block = pl.col(REASONING).is_not_null()
    lead = pl.when(block).then(0).otherwise(pl.col(LEAD_TRIM))
    return (
        turns.with_columns(role_number(role_table).alias("role_number"))
        .with_columns(pl.lit(role_table[ids]).gather(pl.col("role_number")).alias(ids) for ids in pieces)
        .drop("role_number")
        .with_columns(
            pl.col(HEADER_IDS).list.head(pl.col(HEADER_IDS).list.len() - lead).alias(HEADER_IDS),
            pl.col(REASONING_IDS).list.head(pl.col(REASONING_IDS).list.len() - (pl.col(LEAD_TRIM) - lead))
            .alias(REASONING_IDS),
            pl.col(END_IDS).list.slice(pl.col(TRAIL_TRIM)).alias(END_IDS),
        )
        .with_columns(pl.col(REASONING_IDS).list.len().cast(pl.Int32).alias(REASONING_LEN))
        .with_columns(pl.col(ids).list.len().cast(pl.Int32).alias(length) for ids, length in pieces.items())
        .with_columns(
            (pl.col(HEADER_LEN) + pl.col(REASONING_LEN) + pl.col(CONTENT_LEN) + pl.col(CALLS_LEN)
             + pl.col(END_LEN) + pl.col(SEP_LEN)).alias(TURN_LEN)
        )
    )


def _mark_training(turns: pl.LazyFrame, opts: MaskOptions) -> pl.LazyFrame:
    """Per-turn flags: is the header / content / end-of-turn of this turn trained?

    Role rules give the default; a message's own `train` field overrides it
    (LLaMA-Factory style), a weight of 0 turns it off, and `last_assistant_only` / the
    end-of-turn policy narrow it.
    """
    is_assistant = pl.col(ROLE) == "assistant"
    last_assistant = pl.when(is_assistant).then(pl.col(TURN_INDEX)).max().over(CONV)
    trains = pl.coalesce(pl.col(MSG_TRAIN), pl.col(ROLE).is_in(list(opts.train_roles)))
    # A message weighted 0 carries no loss (LLaMA-Factory's loss_weight): it is not trained.
    trains = trains & (pl.col(MSG_WEIGHT).is_null() | (pl.col(MSG_WEIGHT) != 0))
    if opts.last_assistant_only:
        trains = trains & (~is_assistant | (pl.col(TURN_INDEX) == last_assistant))
    end = {
        "turn": trains,
        "last": trains & (pl.col(TURN_INDEX) == last_assistant),
        "all": pl.lit(True),
        "none": pl.lit(False),
    }[opts.eot]
    return turns.with_columns(
        (trains & pl.lit(bool(opts.train_header))).fill_null(False).alias(TRAIN_HEADER),
        (trains & pl.lit(opts.train_reasoning)).fill_null(False).alias(TRAIN_REASONING),
        trains.fill_null(False).alias(TRAIN_CONTENT),
        end.fill_null(False).alias(TRAIN_END),
    )


def require_complete_user(turns: pl.LazyFrame) -> pl.LazyFrame:
    """Complete-user rule: an assistant turn trains only when a whole user turn precedes it in its unit.

    Runs after truncation: a user turn cut by the hard cut (it starts before the window) is
    incomplete, and so is a unit with no user turn at all.
    """
    complete_user = (pl.col(ROLE) == "user") & pl.col(KEEP_WHOLE) & (pl.col(POS) >= pl.col(CUT))
    ok = complete_user.any().over([CONV, UNIT])
    gate = (pl.col(ROLE) != "assistant") | ok
    return turns.with_columns(
        (pl.col(TRAIN_HEADER) & gate).alias(TRAIN_HEADER),
        (pl.col(TRAIN_REASONING) & gate).alias(TRAIN_REASONING),
        (pl.col(TRAIN_CONTENT) & gate).alias(TRAIN_CONTENT),
        (pl.col(TRAIN_END) & gate).alias(TRAIN_END),
    )


def _overlap(lo: pl.Expr, hi: pl.Expr, win_lo: pl.Expr, win_hi: pl.Expr) -> pl.Expr:
    return (hi > lo) & (pl.min_horizontal(hi, win_hi) > pl.max_horizontal(lo, win_lo))


def _place_turns(turns: pl.LazyFrame) -> pl.LazyFrame:
    """Each turn's span in the written example (`start`/`end`, -1 when dropped), `kept`, `trained`."""
    lo = pl.col(CUT) - pl.col(POS)  # the window in turn-relative coordinates
    hi = lo + pl.col(WINDOW)
    h, r, e = pl.col(HEADER_LEN), pl.col(REASONING_LEN), pl.col(END_LEN)
    c = pl.col(CONTENT_LEN) + pl.col(CALLS_LEN)  # calls train with the content
    trained = (
        (pl.col(TRAIN_HEADER) & _overlap(pl.lit(0), h, lo, hi))
        | (pl.col(TRAIN_REASONING) & _overlap(h, h + r, lo, hi))
        | (pl.col(TRAIN_CONTENT) & _overlap(h + r, h + r + c, lo, hi))
        | (pl.col(TRAIN_END) & _overlap(h + r + c, h + r + c + e, lo, hi))
    )
    start = (pl.col(POS) - pl.col(CUT)).clip(0, pl.col(WINDOW))
    end = (pl.col(POS) + pl.col(TURN_LEN) - pl.col(CUT)).clip(0, pl.col(WINDOW))
    kept = pl.col(KEEP_WHOLE) & (end > start)
    return turns.with_columns(
        kept.alias(KEPT),
        pl.when(kept).then(start).otherwise(-1).cast(pl.Int32).alias(START),
        pl.when(kept).then(end).otherwise(-1).cast(pl.Int32).alias(END),
    ).with_columns((pl.col(KEPT) & trained).alias(TRAINED))


def plan_turns(
    records: pl.LazyFrame,
    *,
    encode: Encoder,
    template: TemplateIds,
    reasoning: ReasoningRender = NO_WRAP,
    tools: ToolIds | None = None,
    system_ids: list[int] | None,
    system_text: str | None = None,
    mask: MaskOptions,
    seq_len: int | None,
    bos_len: int,
    eos_len: int,
    truncation: str = "drop_oldest_turns",
    span: ImageSpan | None = None,
) -> pl.LazyFrame:
    """All per-turn stages in order: explode, default system, tokenize, template, mask, truncate.

    `tools` is the template's tool format (None: calls and tools stay the builder's JSON text);
    `system_text` the default system text whose ids are `system_ids`; `seq_len` None: no
    truncation (every turn kept whole).
    """
    if tools is not None and TOOLS in records.collect_schema():
        records = records.with_columns(
            pl.col(TOOLS).map_batches(lambda s: pl.Series(tools_text(s.to_arrow(), tools)), return_dtype=pl.String)
            .alias(TOOLS_TEXT))
    turns = _explode_turns(records)
    turns = _add_default_system(turns, enabled=system_ids is not None, tools=tools is not None)
    if span is not None and IMAGE_TOKENS in records.collect_schema():
        turns = turn_images(turns)
    turns = keep_reasoning(turns, reasoning)
    turns = mark_forms(turns, tools)
    turns = tokenize_calls(turns, encode, tools)
    turns = glue_texts(turns, tools, default_system=system_text if system_ids is not None else None)
    turns = tokenize_contents(turns, encode=encode, template=template, system_ids=system_ids or [],
                               reasoning=reasoning, span=span)
    turns = _attach_template(turns, template.role_table())
    turns = _mark_training(turns, mask)
    turns = plan_truncation(
        turns, seq_len=seq_len, bos_len=bos_len, eos_len=eos_len, policy=truncation
    )
    if mask.require_complete_user:
        turns = require_complete_user(turns)
    return _place_turns(turns)
