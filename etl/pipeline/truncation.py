"""Truncation planning (docs/outputs.md "Semantics"): which whole turns stay, and each conversation's window.

Input: one row per turn, sorted by `CONV` and `TURN_INDEX`, with `ROLE` and the piece lengths
(`HEADER_LEN`, `CONTENT_LEN`, `END_LEN`, `SEP_LEN`, `TURN_LEN`), as `etl.pipeline.stages` builds
them. `plan_truncation` adds `UNIT`, `KEEP_WHOLE`, `POS`, `TOTAL`, `DROP_REASON`, `CUT` and
`WINDOW`. A policy is a pure expression builder in `TRUNCATION_FNS`; the steps around it are
shared. Every per-conversation quantity is a window expression `.over(CONV)`: nothing is
collected and nothing loops per conversation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import polars as pl

from etl.columns import (
    CONV,
    CUT,
    DROP_REASON,
    HEADER_LEN,
    KEEP_WHOLE,
    KEPT,
    POS,
    ROLE,
    SEP_LEN,
    TOTAL,
    TURN_INDEX,
    TURN_LEN,
    UNIT,
    WINDOW,
)
from etl.errors import EtlError

# Helper columns of this module. Window expressions must not nest (an inner .over would run
# inside the outer groups), so running sums are materialized as columns first. They stay in
# the plan: nothing downstream reads them, and they are a few integers per turn.
TAIL = "tail"  # TURN_LEN summed from this turn to the conversation's end
UPTO = "upto"  # TURN_LEN summed from the conversation's start through this turn
LAST_ASSISTANT = "last_asst"  # TURN_INDEX of the conversation's final assistant turn (null: none)
AFTER_FINAL = "after_final"  # tokens after the final assistant end-of-turn (see `_annotate`)
STOP = "stop"  # end (exclusive) of the kept window in the conversation

TOO_LONG = "too_long"  # `drop`: the conversation is longer than seq_len
FIRST_PAIR_TOO_LONG = "first_pair_too_long"  # `keep_prefix`: not even the first unit fits


@dataclass(frozen=True)
class Rule:
    """A policy's decisions, as expressions over the annotated turns.

    Attributes:
        keep_whole: per turn, whether it survives whole-turn dropping (becomes `KEEP_WHOLE`).
        drop_reason: the conversation's reason not to be written, or null; may read `KEEP_WHOLE`.
        stop: end of the kept window in the conversation; may read `POS` and `TOTAL`.
    """

    keep_whole: pl.Expr
    drop_reason: pl.Expr
    stop: pl.Expr


class _TruncationFn(Protocol):
    """Signature shared by every entry of `TRUNCATION_FNS`."""

    def __call__(self, *, seq_len: int, fixed: int) -> Rule:
        """`fixed` is what every example carries besides its turns: BOS + EOS lengths."""
        ...


def _is_head() -> pl.Expr:
    """The leading system turn: every policy keeps it whole."""
    return (pl.col(TURN_INDEX) == 0) & (pl.col(ROLE) == "system")


def _no_reason() -> pl.Expr:
    return pl.lit(None, dtype=pl.String)


def _end_at_final_eot(seq_len: int) -> pl.Expr:
    """Window end after whole-turn dropping: everything when it fits, else the final end-of-turn.

    A hard cut keeps the seq_len tokens that end with the final assistant end-of-turn: turns
    after it carry no loss, and ending there keeps that end-of-turn a target. Without an
    assistant turn there is nothing to protect and the window ends with the conversation.
    """
    final_eot = (
        pl.when(pl.col(TURN_INDEX) == pl.col(LAST_ASSISTANT))
        .then(pl.col(POS) + pl.col(TURN_LEN) - pl.col(SEP_LEN) - 1)
        .max()
        .over(CONV)
    )
    return (
        pl.when((pl.col(TOTAL) <= seq_len) | final_eot.is_null())
        .then(pl.col(TOTAL))
        .otherwise(final_eot + 1)
    )


def drop_oldest_turns(*, seq_len: int, fixed: int) -> Rule:
    """Whole-turn truncation: drop whole oldest units after the system turn until the rest fits, then cut.

    Never drops the unit of the final assistant turn; a hard left cut then keeps the final
    end-of-turn (`_end_at_final_eot`). The fit is measured up to that end-of-turn: what
    follows it carries no loss and the cut drops it when it does not fit. Because unit
    lengths are positive, dropping the fewest oldest units is keeping every unit whose tail
    sum (itself and all later turns) fits next to the head: one reverse cumulative sum.

    Trade-off: every conversation is written and keeps its final answer with the most recent
    context; the opening pairs it may refer to are lost, and the hard cut can leave a partial
    turn at the window's start.
    """
    is_head = _is_head()
    protected = pl.coalesce(
        pl.when(pl.col(TURN_INDEX) == pl.col(LAST_ASSISTANT)).then(pl.col(UNIT)).max().over(CONV),
        pl.col(UNIT).max().over(CONV),
    )
    head_len = fixed + pl.when(is_head).then(pl.col(TURN_LEN)).otherwise(0).sum().over(CONV)
    tail_len = pl.col(TAIL).max().over([CONV, UNIT]) - pl.col(AFTER_FINAL)
    return Rule(
        keep_whole=is_head | (pl.col(UNIT) >= protected) | (head_len + tail_len <= seq_len),
        drop_reason=_no_reason(),
        stop=_end_at_final_eot(seq_len),
    )


def keep_prefix(*, seq_len: int, fixed: int) -> Rule:
    """The post-training length filter: keep the longest prefix of whole units that fits.

    When the first unit does not fit next to the system turn, the conversation is dropped
    (`first_pair_too_long`).

    Trade-off: written examples start as the conversation does (instructions, first question)
    and hold whole pairs only; the later turns, the final answer included, are lost, and
    conversations with a long first pair are lost entirely.
    """
    is_head = _is_head()
    first_unit = pl.when(~is_head).then(pl.col(UNIT)).min().over(CONV)
    first_kept = (pl.col(KEEP_WHOLE) & (pl.col(UNIT) == first_unit)).any().over(CONV)
    return Rule(
        keep_whole=is_head | (fixed + pl.col(UPTO).max().over([CONV, UNIT]) <= seq_len),
        drop_reason=pl.when(~first_kept).then(pl.lit(FIRST_PAIR_TOO_LONG)),
        stop=_end_at_final_eot(seq_len),
    )


def right(*, seq_len: int, fixed: int) -> Rule:
    """Token-level `t[:S]` truncation: keep the first seq_len tokens, wherever the cut falls.

    Trade-off: the cheapest rule and no conversation is lost, but the cut may fall inside a
    turn and take the final answer and its end-of-turn with it (the model never sees the
    stop). Suited to pretraining text, where every token is a target.
    """
    return Rule(
        keep_whole=pl.lit(True),
        drop_reason=_no_reason(),
        stop=pl.min_horizontal(pl.col(TOTAL), seq_len),
    )


def drop(*, seq_len: int, fixed: int) -> Rule:
    """Drop conversations longer than seq_len (`too_long`); the others are written whole.

    Trade-off: every written example is the untouched conversation, but long conversations
    are lost entirely (counted as dropped `too_long` in the manifest), a large share of the
    data when seq_len is short next to the typical chat.
    """
    full = fixed + pl.col(TURN_LEN).sum().over(CONV)
    return Rule(
        keep_whole=pl.lit(True),
        drop_reason=pl.when(full > seq_len).then(pl.lit(TOO_LONG)),
        stop=_end_at_final_eot(seq_len),
    )


def _whole(*, seq_len: int | None, fixed: int) -> Rule:
    """No truncation: every turn whole, nothing dropped, the window the whole conversation."""
    return Rule(keep_whole=pl.lit(True), drop_reason=_no_reason(), stop=pl.col(TOTAL))


# The run's turn policies: names as in `RunConfig.truncation` (`etl.config.file.TURN_POLICIES`).
TRUNCATION_FNS: dict[str, _TruncationFn] = {
    "drop_oldest_turns": drop_oldest_turns,
    "keep_prefix": keep_prefix,
    "right": right,
    "drop": drop,
}


def _annotate(turns: pl.LazyFrame, *, eos_len: int) -> pl.LazyFrame:
    """Add `UNIT`, the running sums `TAIL` / `UPTO`, `LAST_ASSISTANT` and `AFTER_FINAL`.

    Units start at each user turn; the leading system turn is unit -1. `AFTER_FINAL` is what
    the fit test of `drop_oldest_turns` leaves out: everything after the final assistant
    end-of-turn (its separator, later turns, EOS). Those carry no loss and the hard cut drops
    them when they do not fit, so counting them would drop older trained pairs for nothing.
    """
    unit = pl.when(_is_head()).then(-1).otherwise((pl.col(ROLE) == "user").cum_sum().over(CONV))
    last = pl.col(LAST_ASSISTANT)
    after = pl.when(pl.col(TURN_INDEX) > last).then(pl.col(TURN_LEN)).otherwise(0).sum().over(CONV)
    own_sep = pl.when(pl.col(TURN_INDEX) == last).then(pl.col(SEP_LEN)).otherwise(0).sum().over(CONV)
    return turns.with_columns(
        unit.cast(pl.Int32).alias(UNIT),
        pl.col(TURN_LEN).cum_sum(reverse=True).over(CONV).alias(TAIL),
        pl.col(TURN_LEN).cum_sum().over(CONV).alias(UPTO),
        pl.when(pl.col(ROLE) == "assistant").then(pl.col(TURN_INDEX)).max().over(CONV).alias(LAST_ASSISTANT),
    ).with_columns(
        pl.when(last.is_null()).then(0).otherwise(after + own_sep + eos_len).alias(AFTER_FINAL)
    )


def plan_truncation(
    turns: pl.LazyFrame,
    *,
    seq_len: int | None,
    bos_len: int,
    eos_len: int,
    policy: str = "drop_oldest_turns",
) -> pl.LazyFrame:
    """Decide which whole turns stay (`KEEP_WHOLE`) and each conversation's kept window.

    Args:
        turns: one row per turn, sorted by conversation and turn (see the module docstring).
        seq_len: tokens per example, BOS and EOS included (S = T + 1); None: no truncation
            (every turn whole, the window the whole conversation; `policy` is not read).
        bos_len: tokens the example starts with before its first turn.
        eos_len: tokens it ends with after its last turn.
        policy: a key of `TRUNCATION_FNS`.

    Returns:
        `turns` plus `UNIT`, `KEEP_WHOLE`, `POS` (the turn's start before the hard cut),
        `TOTAL`, `DROP_REASON`, `CUT` / `WINDOW` (start and length of the kept window) and
        this module's helper columns.

    Raises:
        EtlError: for an unknown policy (config validation normally catches it first).
    """
    try:
        rule_for = _whole if seq_len is None else TRUNCATION_FNS[policy]
    except KeyError:
        raise EtlError(
            f"unknown truncation policy {policy!r}; allowed: {', '.join(TRUNCATION_FNS)} "
            "(set `truncation` in the config, or --truncation)"
        ) from None
    fixed = bos_len + eos_len
    rule = rule_for(seq_len=seq_len, fixed=fixed)
    limit = pl.col(TOTAL) if seq_len is None else seq_len  # the window's longest
    keep_len = pl.when(pl.col(KEEP_WHOLE)).then(pl.col(TURN_LEN)).otherwise(0)
    return (
        _annotate(turns, eos_len=eos_len)
        .with_columns(rule.keep_whole.alias(KEEP_WHOLE))
        .with_columns(
            (bos_len + keep_len.cum_sum().over(CONV) - keep_len).alias(POS),
            (fixed + keep_len.sum().over(CONV)).alias(TOTAL),
            rule.drop_reason.alias(DROP_REASON),
        )
        .with_columns(rule.stop.alias(STOP))
        .with_columns(pl.max_horizontal(pl.col(STOP) - limit, 0).alias(CUT))
        .with_columns((pl.col(STOP) - pl.col(CUT)).alias(WINDOW))
    )


def headers_cut(turns: pl.DataFrame) -> int:
    """Conversations whose kept window cuts through the header of a turn it keeps (part of it).

    The hard cut of `drop_oldest_turns` starts the window inside a turn and `right` ends it inside
    one: the example then holds text without the role header that says who speaks. A short
    seq_len (16) does this to every example; `etl run` warns with this count (one pass over the
    plan's few integer columns per turn; docs/design.md, Measured costs).
    """
    lo = pl.col(CUT) - pl.col(POS)  # the window in the turn's own coordinates
    hi = lo + pl.col(WINDOW)
    cut = pl.col(KEPT) & (pl.col(HEADER_LEN) > 0) & ((lo > 0) | (hi < pl.col(HEADER_LEN)))
    return int(turns.lazy().filter(cut).select(pl.col(CONV).n_unique()).collect().item())
