"""Reasoning (a message's `<think>` part): which assistant turns keep it and its wrapped ids.

`keep_reasoning` is a stage `LazyFrame -> LazyFrame`; `encode_wrapped` tokenizes only the turns
that have reasoning (none for most data: no tokenizer call at all) and wraps each in the
template's constant prefix/suffix ids with one numpy gather.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from etl.arrow_values import from_numpy, valid_mask
from etl.columns import CONV, REASONING, ROLE, TURN_INDEX
from etl.ragged import range_gather
from etl.tokens.tokenizer import offsets_to_list_array

Encoder = Callable[[pa.Array], pa.LargeListArray]


@dataclass(frozen=True)
class ReasoningRender:
    """Which assistant turns keep their reasoning (all, last: after the conversation's last user
    turn, none) and how it is wrapped: prefix ids + text(pre + R + post) + suffix ids."""

    keep: str = "all"
    empty_last: bool = False  # a final assistant turn without reasoning gets an empty block (Qwen3)
    pre: str = "\n"
    post: str = "\n"
    prefix: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()


NO_WRAP = ReasoningRender()  # every reasoning kept, as bare text: for callers without a template


def keep_reasoning(turns: pl.LazyFrame, render: ReasoningRender) -> pl.LazyFrame:
    """`REASONING` becomes the text to tokenize (pre + R + post) on the assistant turns that keep
    it, null elsewhere: `last` keeps it after the conversation's last user turn (Qwen3's rule).

    With `empty_last` the conversation's final turn, an assistant turn after the last user turn,
    gets an empty reasoning when it has none (Qwen3 renders `<think>\n\n</think>\n\n` there).
    """
    assistant = pl.col(ROLE) == "assistant"
    last_user = pl.when(pl.col(ROLE) == "user").then(pl.col(TURN_INDEX)).max().over(CONV).fill_null(-1)
    after_query = pl.col(TURN_INDEX) > last_user
    reasoning = pl.col(REASONING).str.strip_chars("\n")
    if render.empty_last and render.keep != "none":
        final = assistant & after_query & (pl.col(TURN_INDEX) == pl.col(TURN_INDEX).max().over(CONV))
        # Qwen3 writes a block on another turn only for a reasoning that is not "" (`{% if reasoning_content %}`).
        reasoning = (pl.when(final).then(reasoning.fill_null(""))
                     .when(pl.col(REASONING) != "").then(reasoning))
    has = assistant & reasoning.is_not_null()
    keep = {"all": has, "last": has & after_query, "none": pl.lit(False)}[render.keep]
    text = pl.concat_str([pl.lit(render.pre), reasoning, pl.lit(render.post)])
    return turns.with_columns(pl.when(keep).then(text).otherwise(None).alias(REASONING))


def encode_wrapped(encode: Encoder, texts: pa.Array, prefix: tuple[int, ...], suffix: tuple[int, ...]) -> pa.LargeListArray:
    """prefix + ids(text) + suffix for each non-null text, [] for nulls; the tokenizer sees
    only the non-null texts (none at all for data without reasoning: no call, no cost)."""
    present = np.flatnonzero(valid_mask(texts))
    out_len = np.zeros(len(texts), np.int64)
    if not len(present):
        return offsets_to_list_array(np.zeros(0, np.int32), np.zeros(len(texts) + 1, np.int64))
    enc = encode(texts.take(from_numpy(present)))
    offsets = enc.offsets.to_numpy()
    flat = enc.values.to_numpy(zero_copy_only=False)[offsets[0]:offsets[-1]]
    lens = np.diff(offsets)
    p, q = len(prefix), len(suffix)
    const = np.asarray(prefix + suffix, np.int32)
    # Three ranges per text: the prefix (const[:p]), the ids (after const), the suffix (const[p:]).
    starts = np.stack([np.zeros_like(lens), p + q + offsets[:-1] - offsets[0], np.full_like(lens, p)], axis=1)
    lengths = np.stack([np.full_like(lens, p), lens, np.full_like(lens, q)], axis=1)
    values = np.concatenate([const, flat.astype(np.int32)])[range_gather(starts.ravel(), lengths.ravel())]
    out_len[present] = lens + p + q
    out_offsets = np.concatenate([[0], np.cumsum(out_len)])
    return pa.LargeListArray.from_arrays(pa.array(out_offsets), pa.array(values, pa.int32()))
