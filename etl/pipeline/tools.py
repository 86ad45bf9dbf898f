"""Tools rendered by the template (`etl.tokens.tool_format`): forms, glued texts and call ids.

Stages `LazyFrame -> LazyFrame` over per-turn rows, all skipped for a template without a tool
format (the fast path is untouched):

* `mark_forms`: each turn's `FORM`, the variant of its role's header/end it takes: a tool
  result's place in its run of consecutive results, a system turn that lists tools, an
  assistant turn with calls. `form_table` holds the ids of every (role, form).
* `glue_texts`: the text each form puts next to the content (the tool list after the system
  text, the newline before the first call or before `</tool_response>`) joins the content before
  the tokenizer's batched call, so boundary merges (`}\\n`) come out as whole-text encoding gives.
* `encode_calls`: every call of the chunk (name + arguments | tojson, parsed once per distinct
  call text) in one tokenizer call, wrapped in the constant lead/prefix/suffix ids by one gather.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from etl.arrow_values import list_lengths, string_array
from etl.columns import (
    CALLS,
    CALLS_IDS,
    CALLS_LEN,
    CONTENT,
    CONV,
    FORM,
    INJECTED,
    ROLE,
    TOOLS_TEXT,
    TURN_INDEX,
)
from etl.ragged import range_gather
from etl.tokens.tokenizer import offsets_to_list_array
from etl.tokens.tool_format import RESULT_FIRST, RESULT_LAST, WITH_TOOLS, ToolIds
from etl.tokens.tool_json import BadToolJson, call_parts, tool_lines

Encoder = Callable[[pa.Array], pa.LargeListArray]


def tools_text(tools: pa.Array, fmt: ToolIds) -> pa.Array:
    """Each record's tool list as the template writes it after the system text (null: no tools).

    JSON is parsed once per distinct list (a source usually repeats a few schemas); a list that
    does not parse is written as the text it is, as a template without a tool format would.
    """
    uniq = pc.unique(tools.drop_null())

    def render(text: str) -> str:
        try:
            lines = tool_lines(text)
        except BadToolJson:
            lines = [text]
        return "".join(fmt.tool_before + line for line in lines) + fmt.list_glue

    rendered = string_array([render(t) for t in uniq.to_pylist()])
    return pc.take(rendered, pc.index_in(tools, value_set=uniq))


def mark_forms(turns: pl.LazyFrame, fmt: ToolIds | None) -> pl.LazyFrame:
    """`FORM` of every turn (0 for all of them without a tool format)."""
    if fmt is None:
        return turns.with_columns(pl.lit(0, dtype=pl.Int32).alias(FORM))
    tool = pl.col(ROLE) == "tool"
    first = tool & (pl.col(ROLE).shift(1).over(CONV) != "tool").fill_null(True)
    last = tool & (pl.col(ROLE).shift(-1).over(CONV) != "tool").fill_null(True)
    lists = (pl.col(ROLE) == "system") & (pl.col(TURN_INDEX) == 0) & pl.col(TOOLS_TEXT).is_not_null()
    calls = (pl.col(ROLE) == "assistant") & (pl.col(CALLS).list.len().fill_null(0) > 0)
    form = (
        pl.when(lists | calls).then(WITH_TOOLS)
        .when(tool).then(first.cast(pl.Int32) * RESULT_FIRST + last.cast(pl.Int32) * RESULT_LAST)
        .otherwise(0)
    )
    return turns.with_columns(form.cast(pl.Int32).alias(FORM))


def glue_texts(turns: pl.LazyFrame, fmt: ToolIds | None, *, default_system: str | None) -> pl.LazyFrame:
    """Content text with the glue of its form; the system turn gets the rendered tool list.

    A system turn etl inserted for a record with tools and no system message holds the run's
    default system text (then the list follows as after any system text) or, without one,
    the template's own `no_system` text.
    """
    if fmt is None:
        return turns
    content = pl.col(CONTENT)
    inserted = fmt.no_system if default_system is None else default_system + fmt.system_glue
    system_list = pl.when(pl.col(INJECTED)).then(pl.lit(inserted)).otherwise(content + pl.lit(fmt.system_glue))
    with_form = pl.col(FORM) == WITH_TOOLS
    glued = (
        pl.when(with_form & (pl.col(ROLE) == "system")).then(pl.concat_str([system_list, pl.col(TOOLS_TEXT)]))
        .when(with_form & (pl.col(ROLE) == "assistant") & (content != "")).then(content + pl.lit(fmt.content_glue))
        .when((pl.col(ROLE) == "tool") & ((pl.col(FORM) & RESULT_LAST) > 0)).then(content + pl.lit(fmt.result_glue))
        .when(pl.col(ROLE) == "tool").then(content + pl.lit(fmt.result_glue_mid))
        .otherwise(content)
    )
    return turns.with_columns(glued.alias(CONTENT))


def _call_texts(calls: pa.Array, fmt: ToolIds) -> tuple[pa.Array, np.ndarray]:
    """(distinct call texts to tokenize, index of each call's text): parsed once per distinct call."""
    uniq = pc.unique(calls)

    def render(text: str) -> str:
        try:
            name, args = call_parts(text)
        except BadToolJson:
            # The builder rejected calls without a name (`bad_tool_call`, CALL_BAD in
            # etl.formats.conversation_sql); what is left here is JSON DuckDB reads and Python's
            # does not (a trailing comma, lowercase `nan`): its text in place of the arguments.
            name, args = "", text
        return fmt.call_pre + name + fmt.call_mid + args + fmt.call_post

    texts = pa.array([render(t) for t in uniq.to_pylist()], pa.string())
    return texts, pc.index_in(calls, value_set=uniq).to_numpy(zero_copy_only=False)


def encode_calls(encode: Encoder, calls: pa.Array, nonempty: np.ndarray, fmt: ToolIds) -> pa.LargeListArray:
    """Per turn: lead + prefix + ids(call text) + suffix for each of its calls, [] without calls.

    The lead is `lead_ids` between calls, `lead_empty_ids` first in an empty turn, and nothing
    first after content when the content took it as glue. Distinct call texts are tokenized in
    one call; a gather builds every turn's ids.
    """
    calls = calls.cast(pa.large_list(pa.string()))
    counts = list_lengths(calls)
    flat = pc.list_flatten(calls)
    if not len(flat):
        return offsets_to_list_array(np.zeros(0, np.int32), np.zeros(len(calls) + 1, np.int64))
    texts, index = _call_texts(flat, fmt)
    enc = encode(texts)
    offsets = enc.offsets.to_numpy()
    lens = np.diff(offsets)[index]
    turn = np.repeat(np.arange(len(calls)), counts)
    first = np.arange(len(flat)) == np.repeat(np.cumsum(counts) - counts, counts)
    after_content = first & nonempty[turn]
    # One constant buffer: lead, lead when empty, prefix, suffix; then the tokenized texts.
    parts = [fmt.lead_ids, fmt.lead_empty_ids, fmt.call_prefix, fmt.call_suffix]
    at = np.cumsum([0] + [len(p) for p in parts])
    const = np.asarray([i for p in parts for i in p], np.int32)
    lead_len = np.where(first, np.where(after_content, 0 if fmt.content_glue else len(fmt.lead_ids),
                                        len(fmt.lead_empty_ids)), len(fmt.lead_ids))
    lead_at = np.where(first & ~after_content, at[1], at[0])
    starts = np.stack([lead_at, np.full_like(lens, at[2]), len(const) + offsets[:-1][index] - offsets[0],
                       np.full_like(lens, at[3])], axis=1)
    lengths = np.stack([lead_len, np.full_like(lens, len(fmt.call_prefix)), lens,
                        np.full_like(lens, len(fmt.call_suffix))], axis=1)
    values = enc.values.to_numpy(zero_copy_only=False)[offsets[0]:offsets[-1]].astype(np.int32)
    ids = np.concatenate([const, values])[range_gather(starts.ravel(), lengths.ravel())]
    per_turn = np.bincount(turn, weights=lengths.sum(axis=1), minlength=len(calls)).astype(np.int64)
    return pa.LargeListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(per_turn)])), pa.array(ids, pa.int32()))


def tokenize_calls(turns: pl.LazyFrame, encode: Encoder, fmt: ToolIds | None) -> pl.LazyFrame:
    """`CALLS_IDS` / `CALLS_LEN` of every turn (empty without a tool format or without calls).

    Runs before `glue_texts`: whether the first call follows content is read from the content
    as the record gave it.
    """
    empty = pl.lit([], dtype=pl.List(pl.Int32))
    if fmt is None:
        return turns.with_columns(empty.alias(CALLS_IDS), pl.lit(0, dtype=pl.Int32).alias(CALLS_LEN))

    def encode_batch(s: pl.Series) -> pl.Series:
        parts = s.struct.unnest()
        nonempty = parts[CONTENT].fill_null("").str.len_bytes().to_numpy() > 0
        ids = encode_calls(encode, parts[CALLS].to_arrow(), nonempty, fmt)
        return pl.Series(CALLS_IDS, ids, dtype=pl.List(pl.Int32))

    return turns.with_columns(
        pl.struct(CALLS, CONTENT).map_batches(encode_batch, return_dtype=pl.List(pl.Int32)).alias(CALLS_IDS)
    ).with_columns(pl.col(CALLS_IDS).list.len().cast(pl.Int32).alias(CALLS_LEN))
