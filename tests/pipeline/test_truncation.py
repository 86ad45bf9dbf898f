"""Each truncation policy on a hand-made turn frame, against keep flags and windows worked out by hand.

Every turn is header (1) + content + end-of-turn (1) + separator (0 unless said), so a turn's
length is its content length + 2. BOS = EOS = 1 token, seq_len S = 12. The conversations
(content lengths -> turn lengths, total with BOS/EOS):

    A: system 2, user 3, assistant 4, user 1, assistant 2   turns 4 5 6 3 4    total 24
    B: user 6, assistant 6                                   turns 8 8          total 18
    C: user 0, assistant 1, user 0, assistant 1, user 8      turns 2 3 2 3 10   total 22
    D: user 1, assistant 2                                   turns 3 4          total 9
    E: system 1, user 12 (no assistant)                      turns 3 14         total 19

Units: the leading system turn is -1, then a new unit starts at each user turn. Positions
count from the start of the example, BOS included; the window is [CUT, CUT + WINDOW).
"""

from __future__ import annotations

import polars as pl
import pytest

from etl.columns import (
    CONTENT_LEN,
    CONV,
    CUT,
    DROP_REASON,
    END_LEN,
    HEADER_LEN,
    KEEP_WHOLE,
    POS,
    ROLE,
    SEP_LEN,
    TOTAL,
    TURN_INDEX,
    TURN_LEN,
    WINDOW,
)
from etl.config.file import TURN_POLICIES
from etl.errors import EtlError
from etl.pipeline.pair_truncation import PAIR_ONLY, PAIR_TRUNCATION_FNS
from etl.pipeline.truncation import TRUNCATION_FNS, plan_truncation

S, BOS, EOS = 12, 1, 1
T, F = True, False
Turns = list[tuple[str, int]]  # (role, content length)

CONVS: list[Turns] = [
    [("system", 2), ("user", 3), ("assistant", 4), ("user", 1), ("assistant", 2)],  # A
    [("user", 6), ("assistant", 6)],  # B
    [("user", 0), ("assistant", 1), ("user", 0), ("assistant", 1), ("user", 8)],  # C
    [("user", 1), ("assistant", 2)],  # D
    [("system", 1), ("user", 12)],  # E
]


def turn_frame(convs: list[Turns], *, sep: int = 0) -> pl.LazyFrame:
    """The columns `plan_truncation` reads, typed as `etl.pipeline.stages` makes them."""
    rows = [(n, i, role, size) for n, turns in enumerate(convs) for i, (role, size) in enumerate(turns)]
    conv, index, role, content = (list(column) for column in zip(*rows, strict=True))
    return pl.DataFrame(
        {CONV: conv, TURN_INDEX: index, ROLE: role, CONTENT_LEN: content},
        schema={CONV: pl.UInt32, TURN_INDEX: pl.Int32, ROLE: pl.String, CONTENT_LEN: pl.Int32},
    ).lazy().with_columns(
        pl.lit(1, pl.Int32).alias(HEADER_LEN),
        pl.lit(1, pl.Int32).alias(END_LEN),
        pl.lit(sep, pl.Int32).alias(SEP_LEN),
    ).with_columns(
        (pl.col(HEADER_LEN) + pl.col(CONTENT_LEN) + pl.col(END_LEN) + pl.col(SEP_LEN)).alias(TURN_LEN)
    )


def plan(policy: str, convs: list[Turns] = CONVS, *, seq_len: int = S, bos: int = BOS, eos: int = EOS,
         sep: int = 0) -> dict[int, dict[str, object]]:
    """Per conversation: keep flags and positions per turn; total, cut, window, drop reason."""
    out = plan_truncation(turn_frame(convs, sep=sep), seq_len=seq_len, bos_len=bos, eos_len=eos, policy=policy)
    rows = (
        out.group_by(CONV, maintain_order=True)
        .agg(pl.col(KEEP_WHOLE), pl.col(POS), pl.col(TOTAL, CUT, WINDOW, DROP_REASON).first())
        .collect()
    )
    return {row.pop(CONV): row for row in rows.iter_rows(named=True)}


def conv(keep: list[bool], pos: list[int], total: int, cut: int, window: int, reason: str | None = None) -> dict[str, object]:
    return {KEEP_WHOLE: keep, POS: pos, TOTAL: total, CUT: cut, WINDOW: window, DROP_REASON: reason}


def test_drop_oldest_turns() -> None:
    assert plan("drop_oldest_turns") == {
        # head 4 + BOS/EOS 2; the older pair's unit needs 6 + 18 - 1 (EOS, after the final
        # end-of-turn) = 23 > 12: dropped. Kept 4 + 3 + 4 = 11 (+2 = 13): the window ends at the
        # final end-of-turn (pos 8 + 1 + 2 + 1 = 12), so EOS is cut.
        0: conv([T, F, F, T, T], [1, 5, 5, 5, 8], total=13, cut=0, window=12),
        # one pair, never dropped: hard left cut keeping the end-of-turn at 9 + 1 + 6 + 1 - 1 = 16
        1: conv([T, T], [1, 9], total=18, cut=5, window=12),
        # up to the final end-of-turn 1 + 10 = 11 tokens fit: no pair dropped; the trailing user
        # turn (pos 11) falls outside the window, which ends at that end-of-turn
        2: conv([T, T, T, T, T], [1, 3, 6, 8, 11], total=22, cut=0, window=11),
        3: conv([T, T], [1, 4], total=9, cut=0, window=9),  # fits
        # no assistant turn: nothing is protected or dropped, the window keeps the last 12 tokens
        4: conv([T, T], [1, 4], total=19, cut=7, window=12),
    }


def test_keep_prefix() -> None:
    assert plan("keep_prefix") == {
        # the first unit ends at 4 + 5 + 6 = 15 (+2 > 12): only the system turn is kept
        0: conv([T, F, F, F, F], [1, 5, 5, 5, 5], total=6, cut=0, window=6, reason="first_pair_too_long"),
        1: conv([F, F], [1, 1], total=2, cut=0, window=2, reason="first_pair_too_long"),
        # units end at 5 and 10 (+2 <= 12): kept; the trailing user turn (20 + 2) is not
        2: conv([T, T, T, T, F], [1, 3, 6, 8, 11], total=12, cut=0, window=12),
        3: conv([T, T], [1, 4], total=9, cut=0, window=9),
        4: conv([T, F], [1, 4], total=5, cut=0, window=5, reason="first_pair_too_long"),
    }


def test_right() -> None:
    assert plan("right") == {  # every turn kept; the window is the first 12 tokens
        0: conv([T] * 5, [1, 5, 10, 16, 19], total=24, cut=0, window=12),
        1: conv([T, T], [1, 9], total=18, cut=0, window=12),
        2: conv([T] * 5, [1, 3, 6, 8, 11], total=22, cut=0, window=12),
        3: conv([T, T], [1, 4], total=9, cut=0, window=9),
        4: conv([T, T], [1, 4], total=19, cut=0, window=12),
    }


def test_drop() -> None:
    planned = plan("drop")
    assert {n: row[DROP_REASON] for n, row in planned.items()} == {
        0: "too_long", 1: "too_long", 2: "too_long", 3: None, 4: "too_long"
    }
    assert all(all(row[KEEP_WHOLE]) for row in planned.values())  # no turn is dropped on its own
    assert planned[3] == conv([T, T], [1, 4], total=9, cut=0, window=9)  # the one written whole


@pytest.mark.parametrize(
    "seq_len, keep, pos, total, window",
    [
        # through the final end-of-turn: 5 + 5 + 4 + 6 - 1 (its separator) = 19 tokens fit in 19,
        # although with its separator, the trailing user turn and EOS the chat is 28
        (19, [T, T, T, T, T], [0, 5, 10, 14, 20], 28, 19),
        # one less and the oldest pair goes: 4 + 6 + 7 + EOS = 18 then fits whole
        (18, [F, F, T, T, T], [0, 0, 0, 4, 10], 18, 18),
    ],
)
def test_drop_oldest_turns_fit_ignores_what_follows_the_final_end_of_turn(
    seq_len: int, keep: list[bool], pos: list[int], total: int, window: int
) -> None:
    # separator 1 (ChatML's newline), no BOS: turns 5 5 4 6 7, total 27 + EOS
    chat = [("user", 2), ("assistant", 2), ("user", 1), ("assistant", 3), ("user", 4)]
    planned = plan("drop_oldest_turns", [chat], seq_len=seq_len, bos=0, eos=1, sep=1)
    assert planned == {0: conv(keep, pos, total=total, cut=0, window=window)}


def test_unknown_policy_names_the_allowed_ones() -> None:
    with pytest.raises(EtlError, match="'middle'; allowed: drop_oldest_turns, keep_prefix, right, drop"):
        plan_truncation(turn_frame(CONVS), seq_len=S, bos_len=BOS, eos_len=EOS, policy="middle")


def test_every_configurable_policy_has_a_rule() -> None:
    """Every policy is a conversation rule or a preference pair's (keep_start / keep_end)."""
    assert tuple(TRUNCATION_FNS) + PAIR_ONLY == TURN_POLICIES
    assert set(PAIR_TRUNCATION_FNS) <= set(TURN_POLICIES)
