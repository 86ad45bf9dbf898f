"""Golden and property tests for seed 000 (pr-04): ngpt chat format, assistant-only loss mask,
whole-turn truncation / padding to S = T + 1, and collate into (x, y, loss_mask).

Every expected id and mask below is written out by hand from the seed text, with the tiny fake
tokenizer the seed describes (four special tokens at fixed ids, other text split on spaces into
deterministic fake ids). Nothing here derives an expected value from `etl.sft` itself.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from etl.sft import (
    DEFAULT_SYSTEM_TEXT,
    IGNORE_INDEX,
    collate_sft_batch,
    pack_sft_ids_and_mask,
    serialize_chat_to_ids,
    sft_loss_mask_for_ids,
)

# The four special tokens, spelled exactly as in the seed (not imported from etl.tokens.templates, so a
# drift there shows up as a KeyError in the fake tokenizer).
SFX = "84a5023f67d74cf29cc4001becde983c"
SYS_TOK = f"<|ngpt_sys_{SFX}|>"
USR_TOK = f"<|ngpt_usr_{SFX}|>"
ASST_TOK = f"<|ngpt_asst_{SFX}|>"
EOT_TOK = f"<|ngpt_eot_{SFX}|>"

SYS, USR, ASST, EOT = 1, 2, 3, 4
SPECIAL_IDS = {SYS_TOK: SYS, USR_TOK: USR, ASST_TOK: ASST, EOT_TOK: EOT}
PAD = EOT  # seed: pad_id = eot_id
IDS_KW = {"sys_id": SYS, "usr_id": USR, "asst_id": ASST, "eot_id": EOT}
F, T_ = False, True  # short literals for hand-written masks


class FakeTokenizer:
    """Seed 000's test tokenizer: specials map to fixed ids; text is split on spaces.

    Words found in `vocab` keep their id; an unseen word gets the next free id (never below
    `first_new_id`, far above the special ids). `encode` never yields a special id, even for
    the literal special-token string: only `token_to_id` knows the four special tokens.
    """

    def __init__(self, vocab: dict[str, int] | None = None, first_new_id: int = 1000) -> None:
        self.vocab = dict(vocab or {})
        self._next = max([first_new_id, *(v + 1 for v in self.vocab.values())])

    def encode(self, text: str) -> list[int]:
        out = []
        for word in text.split(" "):
            if not word:
                continue
            if word not in self.vocab:
                self.vocab[word] = self._next
                self._next += 1
            out.append(self.vocab[word])
        return out

    def token_to_id(self, token: str) -> int:
        return SPECIAL_IDS[token]  # KeyError for anything that is not one of the four


# Fixed vocabulary for the golden tests. DEFAULT_SYSTEM_TEXT = "you are a helpful assistant."
# -> 100 101 102 103 104.
VOCAB = {
    "you": 100, "are": 101, "a": 102, "helpful": 103, "assistant.": 104,
    "hi": 110, "there": 111, "how": 112,
    "hello": 120, "fine": 121, "thanks": 122,
    "be": 130, "brief": 131,
    "say": 150, "now": 152, "ok": 153, "done": 154,
    ASST_TOK: 160,  # a literal marker string inside content is just a word to this tokenizer
}


@pytest.fixture
def tok() -> FakeTokenizer:
    return FakeTokenizer(VOCAB)


def chat(*pairs: tuple[str, str]) -> dict:
    return {"messages": [{"role": r, "content": c} for r, c in pairs]}


def serialize(ex: dict, tokenizer: FakeTokenizer, default: str = DEFAULT_SYSTEM_TEXT) -> list[int]:
    return serialize_chat_to_ids(ex, tokenizer=tokenizer, default_system_text=default)


def mask_of(ids: list[int]) -> list[bool]:
    return sft_loss_mask_for_ids(ids, **IDS_KW)


def pack(ids, mask, S, pad_id=PAD):
    return pack_sft_ids_and_mask(ids, mask, S=S, pad_id=pad_id, **IDS_KW)


ONE_TURN = chat(("user", "hi there"), ("assistant", "hello"))
#                 sys  you are a  helpful assistant. eot usr hi  there eot asst hello eot
ONE_TURN_IDS = [SYS, 100, 101, 102, 103, 104, EOT, USR, 110, 111, EOT, ASST, 120, EOT]
ONE_TURN_MASK = [F, F, F, F, F, F, F, F, F, F, F, F, T_, T_]

TWO_TURNS = chat(
    ("user", "hi there"), ("assistant", "hello"), ("user", "how are you"), ("assistant", "fine thanks")
)
TWO_TURNS_IDS = [
    SYS, 100, 101, 102, 103, 104, EOT,  # 0..6
    USR, 110, 111, EOT,                 # 7..10
    ASST, 120, EOT,                     # 11..13
    USR, 112, 101, 100, EOT,            # 14..18
    ASST, 121, 122, EOT,                # 19..22
]
TWO_TURNS_MASK = [
    F, F, F, F, F, F, F,
    F, F, F, F,
    F, T_, T_,
    F, F, F, F, F,
    F, T_, T_, T_,
]


# ---------------------------------------------------------------------------------------------
# 0. constants the seed fixes
# ---------------------------------------------------------------------------------------------


def test_seed_constants():
    assert DEFAULT_SYSTEM_TEXT == "you are a helpful assistant."
    assert IGNORE_INDEX == -100


# ---------------------------------------------------------------------------------------------
# 1. serialization shape
# ---------------------------------------------------------------------------------------------


def test_serialize_one_turn_without_system_injects_default(tok):
    ids = serialize(ONE_TURN, tok)
    assert ids == ONE_TURN_IDS
    assert ids[0] == SYS
    assert ids[-1] == EOT


def test_serialize_multi_turn_shape(tok):
    ids = serialize(TWO_TURNS, tok)
    assert ids == TWO_TURNS_IDS
    assert ids[0] == SYS and ids.count(SYS) == 1
    # every turn ends with EOT: each role marker after the first is preceded by EOT, and so is
    # the end of the sequence; one EOT per turn (system + 4 messages).
    role_positions = [i for i, t in enumerate(ids) if t in (SYS, USR, ASST)]
    assert role_positions == [0, 7, 11, 14, 19]
    assert all(ids[p - 1] == EOT for p in role_positions[1:])
    assert ids[-1] == EOT
    assert [i for i, t in enumerate(ids) if t == EOT] == [6, 10, 13, 18, 22]


def test_serialize_uses_default_system_text_argument(tok):
    ids = serialize(ONE_TURN, tok, default="be brief")
    assert ids == [SYS, 130, 131, EOT, USR, 110, 111, EOT, ASST, 120, EOT]


def test_serialize_uses_system_message_when_present(tok):
    ex = chat(("system", "be brief"), ("user", "hi there"), ("assistant", "hello"))
    ids = serialize(ex, tok)
    assert ids == [SYS, 130, 131, EOT, USR, 110, 111, EOT, ASST, 120, EOT]
    assert ids.count(SYS) == 1
    assert not {100, 101, 102, 103, 104} & set(ids)  # default text not injected


@pytest.mark.parametrize(
    "ex, expected",
    [
        (
            chat(("user", "hi there"), ("system", "be brief"), ("assistant", "hello")),
            [SYS, 100, 101, 102, 103, 104, EOT, USR, 110, 111, EOT, SYS, 130, 131, EOT, ASST, 120, EOT],
        ),
        (
            chat(("system", "be brief"), ("system", "be brief"), ("user", "hi"), ("assistant", "ok")),
            [SYS, 130, 131, EOT, SYS, 130, 131, EOT, USR, 110, EOT, ASST, 153, EOT],
        ),
    ],
    ids=["system-not-first", "two-systems"],
)
def test_serialize_misplaced_system_messages_stay_turns(tok, ex, expected):
    # Decision (documented in etl/sft.py): the seed's "SYS once" holds for the canonical input
    # (an optional system message first). A system message elsewhere is not dropped or merged:
    # it stays a system turn where it was, as Hugging Face chat templates (Qwen2.5) render it,
    # and it is never trained.
    ids = serialize(ex, tok)
    assert ids[0] == SYS
    assert ids == expected
    assert not any(mask_of(ids)[i] for i, t in enumerate(ids) if t == SYS)


# ---------------------------------------------------------------------------------------------
# 2. mask correctness
# ---------------------------------------------------------------------------------------------


def test_mask_one_turn(tok):
    ids = serialize(ONE_TURN, tok)
    assert mask_of(ids) == ONE_TURN_MASK
    # the same on the literal ids, independent of serialization
    assert mask_of(ONE_TURN_IDS) == ONE_TURN_MASK


def test_mask_multi_turn():
    assert mask_of(TWO_TURNS_IDS) == TWO_TURNS_MASK


def test_mask_scanning_rule_edge_cases():
    # an empty assistant message: only its EOT is trained
    assert mask_of([SYS, EOT, USR, 110, EOT, ASST, EOT]) == [F, F, F, F, F, F, T_]
    # EOTs outside an assistant span (system/user ends, padding) are never trained
    assert mask_of([EOT, USR, 110, EOT, ASST, 120, EOT, EOT, EOT]) == [F, F, F, F, F, T_, T_, F, F]
    # a repeated assistant marker is itself False and (re-)enters assistant mode
    assert mask_of([ASST, 120, ASST, 121, EOT]) == [F, T_, F, T_, T_]
    assert mask_of([]) == []


# ---------------------------------------------------------------------------------------------
# 3. truncate by whole turns
# ---------------------------------------------------------------------------------------------

# sys(3) + pair1(4+5) + pair2(3+4) + pair3(4+4) = 27 tokens
LONG_IDS = [
    SYS, 100, EOT,
    USR, 110, 111, EOT, ASST, 120, 121, 122, EOT,
    USR, 112, EOT, ASST, 123, 124, EOT,
    USR, 113, 114, EOT, ASST, 125, 126, EOT,
]
LONG_MASK = [
    F, F, F,
    F, F, F, F, F, T_, T_, T_, T_,
    F, F, F, F, T_, T_, T_,
    F, F, F, F, F, T_, T_, T_,
]


@pytest.mark.parametrize(
    "S, exp_ids, exp_mask",
    [
        # fits: unchanged
        (27, LONG_IDS, LONG_MASK),
        # 27 > 26: drop pair1 only (18 tokens), then pad 8
        (
            26,
            [SYS, 100, EOT, USR, 112, EOT, ASST, 123, 124, EOT, USR, 113, 114, EOT, ASST, 125, 126,
             EOT] + [PAD] * 8,
            [F, F, F, F, F, F, F, T_, T_, T_, F, F, F, F, F, T_, T_, T_] + [F] * 8,
        ),
        # exact fit after dropping pair1
        (
            18,
            [SYS, 100, EOT, USR, 112, EOT, ASST, 123, 124, EOT, USR, 113, 114, EOT, ASST, 125, 126,
             EOT],
            [F, F, F, F, F, F, F, T_, T_, T_, F, F, F, F, F, T_, T_, T_],
        ),
        # 18 > 17: drop pair2 as well -> sys + last pair (11), pad 6
        (
            17,
            [SYS, 100, EOT, USR, 113, 114, EOT, ASST, 125, 126, EOT] + [PAD] * 6,
            [F, F, F, F, F, F, F, F, T_, T_, T_] + [F] * 6,
        ),
        (
            11,
            [SYS, 100, EOT, USR, 113, 114, EOT, ASST, 125, 126, EOT],
            [F, F, F, F, F, F, F, F, T_, T_, T_],
        ),
    ],
)
def test_pack_drops_oldest_pairs_first_and_keeps_last_assistant(S, exp_ids, exp_mask):
    ids, mask = pack(LONG_IDS, LONG_MASK, S)
    assert ids == exp_ids
    assert mask == exp_mask
    assert len(ids) == len(mask) == S


def test_pack_whole_turns_end_to_end_from_a_chat(tok):
    ids = serialize(TWO_TURNS, tok)
    mask = mask_of(ids)
    # 23 tokens; S = 16: dropping the first pair (7 tokens) leaves 16
    got_ids, got_mask = pack(ids, mask, 16)
    assert got_ids == [SYS, 100, 101, 102, 103, 104, EOT, USR, 112, 101, 100, EOT, ASST, 121, 122,
                       EOT]
    assert got_mask == [F, F, F, F, F, F, F, F, F, F, F, F, F, T_, T_, T_]


def test_pack_trailing_user_turn_is_kept_when_dropping_old_pairs_suffices():
    ids = [
        SYS, 100, EOT,
        USR, 110, 111, EOT, ASST, 120, 121, 122, EOT,
        USR, 112, EOT, ASST, 123, 124, EOT,
        USR, 150, EOT,
    ]
    mask = [
        F, F, F,
        F, F, F, F, F, T_, T_, T_, T_,
        F, F, F, F, T_, T_, T_,
        F, F, F,
    ]
    got_ids, got_mask = pack(ids, mask, 14)  # 22 > 14; drop the oldest pair -> 13, pad 1
    assert got_ids == [SYS, 100, EOT, USR, 112, EOT, ASST, 123, 124, EOT, USR, 150, EOT, PAD]
    assert got_mask == [F, F, F, F, F, F, F, T_, T_, T_, F, F, F, F]


# ---------------------------------------------------------------------------------------------
# 3b. hard left-truncation edge rules
# ---------------------------------------------------------------------------------------------

# one assistant message alone is longer than S
HUGE_IDS = [SYS, 100, EOT, USR, 110, EOT, ASST, 130, 131, 132, 133, 134, 135, 136, 137, 138, 139,
            EOT]
HUGE_MASK = [F, F, F, F, F, F, F] + [T_] * 10 + [T_]


@pytest.mark.parametrize(
    "S, exp_ids, exp_mask",
    [
        (8, [133, 134, 135, 136, 137, 138, 139, EOT], [T_] * 8),
        (13, [EOT, ASST, 130, 131, 132, 133, 134, 135, 136, 137, 138, 139, EOT], [F, F] + [T_] * 11),
        (2, [139, EOT], [T_, T_]),
        (1, [EOT], [T_]),
    ],
)
def test_pack_hard_left_truncation_keeps_final_eot_last(S, exp_ids, exp_mask):
    ids, mask = pack(HUGE_IDS, HUGE_MASK, S)
    assert ids == exp_ids
    assert mask == exp_mask
    assert ids[-1] == EOT and mask[-1] is True


def test_pack_hard_truncation_after_dropping_earlier_pairs():
    ids = [SYS, 100, EOT, USR, 110, 111, EOT, ASST, 120, EOT] + HUGE_IDS[3:]
    mask = [F, F, F, F, F, F, F, F, T_, T_] + HUGE_MASK[3:]
    got_ids, got_mask = pack(ids, mask, 8)
    assert got_ids == [133, 134, 135, 136, 137, 138, 139, EOT]
    assert got_mask == [T_] * 8


def test_pack_trailing_user_after_final_assistant_window_ends_at_final_eot():
    # conversation ends with a long user turn after the final assistant turn; 22 tokens
    ids = [SYS, 100, EOT, USR, 110, EOT, ASST, 120, 121, EOT,
           USR, 140, 141, 142, 143, 144, 145, 146, 147, 148, 149, EOT]
    mask = [F, F, F, F, F, F, F, T_, T_, T_] + [F] * 12
    got_ids, got_mask = pack(ids, mask, 8)
    assert got_ids == [EOT, USR, 110, EOT, ASST, 120, 121, EOT]
    assert got_mask == [F, F, F, F, F, T_, T_, T_]


def test_pack_long_trailing_user_keeps_final_eot_when_window_would_start_before_zero():
    # the final assistant turn ends at index 8 (stop = 9 < S = 10) and the last S tokens (11..20)
    # lie inside the trailing user turn: the kept window must still hold that EOT (seed rule 3).
    ids = [SYS, 100, EOT, USR, 110, EOT, ASST, 153, EOT,
           USR, 140, 141, 142, 143, 144, 145, 146, 147, 148, 149, EOT]
    mask = [F, F, F, F, F, F, F, T_, T_] + [F] * 12
    got_ids, got_mask = pack(ids, mask, 10)
    assert len(got_ids) == len(got_mask) == 10
    assert got_ids[:9] == [SYS, 100, EOT, USR, 110, EOT, ASST, 153, EOT]
    assert got_mask[:9] == [F, F, F, F, F, F, F, T_, T_]
    # position 9: padding after the EOT, or the first token of the trailing user turn
    assert got_ids[9] in (PAD, USR) and got_mask[9] is False


def test_pack_final_eot_stays_a_target_with_trailing_user():
    ids = [SYS, 100, EOT, USR, 110, EOT, ASST, 120, EOT, USR, 140, 141, 142, 143, 144, 145, EOT]
    mask = [F, F, F, F, F, F, F, T_, T_] + [F] * 8
    packed = pack(ids, mask, 9)  # T = 8
    _, y, loss_mask = collate_sft_batch([packed], T=8, device="cpu")
    assert EOT in y[0][loss_mask[0]].tolist()


# ---------------------------------------------------------------------------------------------
# 4. pad behaviour
# ---------------------------------------------------------------------------------------------


def test_pack_pads_with_pad_id_and_false_mask():
    ids, mask = pack(ONE_TURN_IDS, ONE_TURN_MASK, 20)
    assert ids == [SYS, 100, 101, 102, 103, 104, EOT, USR, 110, 111, EOT, ASST, 120, EOT,
                   EOT, EOT, EOT, EOT, EOT, EOT]
    assert mask == [F, F, F, F, F, F, F, F, F, F, F, F, T_, T_, F, F, F, F, F, F]


def test_pack_uses_the_given_pad_id():
    ids, mask = pack(ONE_TURN_IDS, ONE_TURN_MASK, 17, pad_id=0)
    assert ids == [SYS, 100, 101, 102, 103, 104, EOT, USR, 110, 111, EOT, ASST, 120, EOT, 0, 0, 0]
    assert mask == [F, F, F, F, F, F, F, F, F, F, F, F, T_, T_, F, F, F]


def test_pack_exact_length_is_unchanged():
    ids, mask = pack(ONE_TURN_IDS, ONE_TURN_MASK, 14)
    assert ids == ONE_TURN_IDS
    assert mask == ONE_TURN_MASK


# ---------------------------------------------------------------------------------------------
# 5. collate alignment
# ---------------------------------------------------------------------------------------------


def test_collate_alignment_and_ignore_index():
    packed = [
        ([USR, 110, EOT, ASST, 120, EOT], [F, F, F, F, T_, T_]),
        ([ASST, 121, 122, EOT, PAD, PAD], [F, T_, T_, T_, F, F]),
        ([130, 131, 132, 133, 134, EOT], [T_, T_, T_, T_, T_, T_]),  # hard-truncated window
    ]
    x, y, loss_mask = collate_sft_batch(packed, T=5, device="cpu")
    assert x.shape == y.shape == loss_mask.shape == (3, 5)
    assert x.dtype == torch.int64 and y.dtype == torch.int64 and loss_mask.dtype == torch.bool
    assert x.tolist() == [
        [USR, 110, EOT, ASST, 120],
        [ASST, 121, 122, EOT, PAD],
        [130, 131, 132, 133, 134],
    ]
    assert y.tolist() == [
        [-100, -100, -100, 120, EOT],
        [121, 122, EOT, -100, -100],
        [131, 132, 133, 134, EOT],
    ]
    assert loss_mask.tolist() == [
        [F, F, F, T_, T_],
        [T_, T_, T_, F, F],
        [T_, T_, T_, T_, T_],
    ]


def test_collate_custom_ignore_index():
    _, y, _ = collate_sft_batch([([ASST, 120, EOT], [F, T_, T_])], T=2, device="cpu",
                                ignore_index=-1)
    assert y.tolist() == [[120, EOT]]
    _, y, _ = collate_sft_batch([([USR, 110, EOT], [F, F, F])], T=2, device="cpu", ignore_index=-1)
    assert y.tolist() == [[-1, -1]]


def test_end_to_end_one_turn(tok):
    ids = serialize(ONE_TURN, tok)
    packed = pack(ids, mask_of(ids), 16)  # T = 15
    x, y, loss_mask = collate_sft_batch([packed], T=15, device="cpu")
    assert x.tolist() == [[SYS, 100, 101, 102, 103, 104, EOT, USR, 110, 111, EOT, ASST, 120, EOT,
                           EOT]]
    assert y.tolist() == [[-100] * 11 + [120, EOT, -100, -100]]
    assert loss_mask.tolist() == [[F] * 11 + [T_, T_, F, F]]


# ---------------------------------------------------------------------------------------------
# determinism and literal special-token strings in content
# ---------------------------------------------------------------------------------------------


def test_deterministic_and_inputs_not_mutated():
    ex = copy.deepcopy(TWO_TURNS)
    tok_a = FakeTokenizer(VOCAB)
    ids1 = serialize(ex, tok_a)
    ids2 = serialize(ex, tok_a)
    ids3 = serialize(ex, FakeTokenizer(VOCAB))
    assert ids1 == ids2 == ids3 == TWO_TURNS_IDS
    assert ex == TWO_TURNS
    m1, m2 = mask_of(ids1), mask_of(ids1)
    assert m1 == m2 == TWO_TURNS_MASK
    ids_before, mask_before = list(ids1), list(m1)
    p1, p2 = pack(ids1, m1, 12), pack(ids1, m1, 12)
    assert p1 == p2
    assert ids1 == ids_before and m1 == mask_before
    c1 = collate_sft_batch([p1], T=11, device="cpu")
    c2 = collate_sft_batch([p2], T=11, device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(c1, c2))


def test_literal_special_token_strings_in_content_are_ordinary_words(tok):
    ex = chat(
        ("user", f"say {EOT_TOK} {ASST_TOK} now"),
        ("assistant", f"ok {EOT_TOK} done"),
    )
    ids = serialize(ex, tok)
    # the EOT string is unseen by VOCAB -> the fake tokenizer's first new id, 1000 (both places);
    # the ASST string is a preset ordinary word (160)
    assert ids == [SYS, 100, 101, 102, 103, 104, EOT,
                   USR, 150, 1000, 160, 152, EOT,
                   ASST, 153, 1000, 154, EOT]
    assert ids.count(EOT) == 3 and ids.count(ASST) == 1
    mask = mask_of(ids)
    assert mask == [F] * 14 + [T_, T_, T_, T_]
    # hard truncation: the literal string in content is not a stop boundary
    assert pack(ids, mask, 4) == ([153, 1000, 154, EOT], [T_, T_, T_, T_])


# ---------------------------------------------------------------------------------------------
# hypothesis properties
# ---------------------------------------------------------------------------------------------

# Words whose fake id tells where they came from: system 2xx, user 3xx, assistant 4xx.
S_WORDS = {f"s{i}": 200 + i for i in range(6)}
U_WORDS = {f"u{i}": 300 + i for i in range(6)}
A_WORDS = {f"a{i}": 400 + i for i in range(6)}
PROP_VOCAB = {**VOCAB, **S_WORDS, **U_WORDS, **A_WORDS}
SYS_CONTENT = set(S_WORDS.values()) | {100, 101, 102, 103, 104}
USR_CONTENT = set(U_WORDS.values())
ASST_CONTENT = set(A_WORDS.values())


def _text(pool: dict[str, int], max_size: int):
    return st.lists(st.sampled_from(sorted(pool)), max_size=max_size).map(" ".join)


conversations = st.tuples(
    st.none() | _text(S_WORDS, 6),  # system (None -> default injected)
    st.lists(st.tuples(_text(U_WORDS, 6), _text(A_WORDS, 10)), min_size=1, max_size=5),
    st.none() | _text(U_WORDS, 24),  # trailing user turn after the final assistant
)


def _as_example(conv) -> dict:
    system, pairs, trailing = conv
    msgs = [] if system is None else [{"role": "system", "content": system}]
    for u, a in pairs:
        msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
    if trailing is not None:
        msgs.append({"role": "user", "content": trailing})
    return {"messages": msgs}


def _seg(role_id: int, text: str, trained: bool) -> tuple[list[int], list[bool]]:
    words = [PROP_VOCAB[w] for w in text.split(" ") if w]
    return [role_id, *words, EOT], [False] + [trained] * len(words) + [trained]


def _oracle(conv):
    """Independent statement of the seed: segments (ids, mask) for system, each pair, trailing."""
    system, pairs, trailing = conv
    sys_seg = _seg(SYS, DEFAULT_SYSTEM_TEXT if system is None else system, False)
    pair_segs = []
    for u, a in pairs:
        ui, um = _seg(USR, u, False)
        ai, am = _seg(ASST, a, True)
        pair_segs.append((ui + ai, um + am))
    trail_seg = ([], []) if trailing is None else _seg(USR, trailing, False)
    return sys_seg, pair_segs, trail_seg


def _join(*segs):
    ids, mask = [], []
    for i, m in segs:
        ids += i
        mask += m
    return ids, mask


def _check_mask_provenance(ids: list[int], mask: list[bool]) -> None:
    """mask is True exactly on assistant content and assistant-ending EOTs, read off the ids."""
    for i, (t, m) in enumerate(zip(ids, mask)):
        if t in (SYS, USR, ASST) or t in SYS_CONTENT or t in USR_CONTENT:
            assert m is False, (i, t)
        elif t in ASST_CONTENT:
            assert m is True, (i, t)
        else:
            assert t == EOT, (i, t)
            if i == 0:
                continue  # whose EOT this is cannot be read off the window
            prev = ids[i - 1]
            owned_by_assistant = prev == ASST or prev in ASST_CONTENT
            assert m is owned_by_assistant, (i, t)


# derandomize: the same examples on every run (CI-stable, no flaky discoveries)
PROP = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@PROP
@given(conv=conversations)
def test_prop_serialize_and_mask_match_seed_template(conv):
    sys_seg, pair_segs, trail_seg = _oracle(conv)
    exp_ids, exp_mask = _join(sys_seg, *pair_segs, trail_seg)
    ids = serialize(_as_example(conv), FakeTokenizer(PROP_VOCAB))
    assert ids == exp_ids
    assert mask_of(ids) == exp_mask
    _check_mask_provenance(ids, exp_mask)


@PROP
@given(conv=conversations, S=st.integers(min_value=1, max_value=60))
def test_prop_pack(conv, S):
    sys_seg, pair_segs, trail_seg = _oracle(conv)
    ids = serialize(_as_example(conv), FakeTokenizer(PROP_VOCAB))
    mask = mask_of(ids)
    got_ids, got_mask = pack(ids, mask, S)

    # length exactly S
    assert len(got_ids) == len(got_mask) == S
    # mask False on every non-assistant-content position (and True on every assistant one)
    _check_mask_provenance(got_ids, got_mask)
    # the final assistant EOT always survives, and is the last trained token
    trained = [i for i, m in enumerate(got_mask) if m]
    assert trained, "the final assistant EOT must survive"
    assert got_ids[trained[-1]] == EOT

    if len(ids) <= S:  # nothing dropped, only padding
        assert got_ids == ids + [PAD] * (S - len(ids))
        assert got_mask == mask + [False] * (S - len(ids))
        return

    # rule 1: drop whole oldest user+assistant pairs until what ends with the final assistant
    # EOT fits (never the final pair); a trailing turn after it carries no loss, so it is kept
    # only when it fits too, and otherwise cut by the window that ends at that EOT
    for k in range(len(pair_segs)):
        core_ids, core_mask = _join(sys_seg, *pair_segs[k:])
        if len(core_ids) <= S:
            cand_ids, cand_mask = _join(sys_seg, *pair_segs[k:], trail_seg)
            if len(cand_ids) > S:
                cand_ids, cand_mask = core_ids, core_mask
            assert got_ids == cand_ids + [PAD] * (S - len(cand_ids))
            assert got_mask == cand_mask + [False] * (S - len(cand_ids))
            return

    # rule 3: still too long -> hard truncation of the remaining sequence, final EOT kept
    rem_ids, rem_mask = _join(sys_seg, pair_segs[-1], trail_seg)
    final_eot = len(sys_seg[0]) + len(pair_segs[-1][0]) - 1
    assert len(rem_ids) > S
    # the window is the (at most) S tokens that end with the final assistant EOT; turns after
    # it carry no loss and are cut, so that EOT stays a target
    start = max(0, final_eot + 1 - S)
    expect_ids = rem_ids[start : final_eot + 1]
    expect_mask = rem_mask[start : final_eot + 1]
    assert got_ids == expect_ids + [PAD] * (S - len(expect_ids))
    assert got_mask == expect_mask + [False] * (S - len(expect_ids))


# short head, long trailing user turn: the hard-truncation window must still hold the final EOT
long_trailing = st.tuples(
    _text(S_WORDS, 2),
    st.lists(st.tuples(_text(U_WORDS, 2), _text(A_WORDS, 3)), min_size=1, max_size=2),
    st.lists(st.sampled_from(sorted(U_WORDS)), min_size=8, max_size=30).map(" ".join),
)


@PROP
@given(conv=long_trailing, S=st.integers(min_value=1, max_value=40))
def test_prop_pack_long_trailing_user_keeps_final_eot(conv, S):
    ids = serialize(_as_example(conv), FakeTokenizer(PROP_VOCAB))
    got_ids, got_mask = pack(ids, mask_of(ids), S)
    assert len(got_ids) == len(got_mask) == S
    _check_mask_provenance(got_ids, got_mask)
    trained = [i for i, m in enumerate(got_mask) if m]
    assert trained, "seed rule 3: the last assistant EOT must remain present"
    assert got_ids[trained[-1]] == EOT


# imperfect alternation (robustness): any user/assistant order with at least one assistant
imperfect = st.lists(
    st.one_of(
        st.tuples(st.just("user"), _text(U_WORDS, 5)),
        st.tuples(st.just("assistant"), _text(A_WORDS, 8)),
    ),
    min_size=1,
    max_size=8,
).filter(lambda msgs: any(r == "assistant" for r, _ in msgs))


@PROP
@given(msgs=imperfect, S=st.integers(min_value=1, max_value=40))
def test_prop_pack_robust_to_imperfect_alternation(msgs, S):
    ids = serialize(chat(*msgs), FakeTokenizer(PROP_VOCAB))
    mask = mask_of(ids)
    _check_mask_provenance(ids, mask)
    got_ids, got_mask = pack(ids, mask, S)
    assert len(got_ids) == len(got_mask) == S
    _check_mask_provenance(got_ids, got_mask)
    trained = [i for i, m in enumerate(got_mask) if m]
    assert trained and got_ids[trained[-1]] == EOT
    if len(ids) <= S:
        assert got_ids == ids + [PAD] * (S - len(ids))
        assert got_mask == mask + [False] * (S - len(ids))


@PROP
@given(
    data=st.data(),
    B=st.integers(min_value=1, max_value=4),
    T=st.integers(min_value=0, max_value=12),
)
def test_prop_collate_alignment(data, B, T):
    packed = [
        (
            data.draw(st.lists(st.integers(0, 500), min_size=T + 1, max_size=T + 1)),
            data.draw(st.lists(st.booleans(), min_size=T + 1, max_size=T + 1)),
        )
        for _ in range(B)
    ]
    x, y, loss_mask = collate_sft_batch(packed, T=T, device="cpu")
    assert x.shape == y.shape == loss_mask.shape == (B, T)
    assert (x.dtype, y.dtype, loss_mask.dtype) == (torch.int64, torch.int64, torch.bool)
    for b, (ids, mask) in enumerate(packed):
        assert x[b].tolist() == ids[:-1]
        assert loss_mask[b].tolist() == mask[1:]
        assert y[b].tolist() == [t if m else -100 for t, m in zip(ids[1:], mask[1:])]
