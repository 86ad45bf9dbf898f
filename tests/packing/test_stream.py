"""Seed 001's stream packer, rule by rule from the seed's text, against a token-level reference.

Token ids are post_training's: <|SYSTEM|>=256 <|USER|>=257 <|ASSISTANT|>=258 <|END|>=259
<|EOS|>=260; content tokens are ids below 256.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.cli import main
from etl.errors import EtlError, EtlWarning
from etl.packing.pieces import Packing
from etl.packing.stream import stream
from etl.packing.turn_spans import (
    ROLE_ASSISTANT,
    ROLE_SYSTEM,
    ROLE_USER,
    TurnSpans,
    header_lengths,
    turn_spans,
)

SYS, USR, AST, END, EOS = 256, 257, 258, 259, 260
PAD_HEADER = 261  # extra header tokens of a multi-token user header (ChatML's "user\n")
MARKERS = {"system": SYS, "user": USR, "assistant": AST}
CODES = {"system": ROLE_SYSTEM, "user": ROLE_USER, "assistant": ROLE_ASSISTANT}
RAW = Path(__file__).resolve().parents[2] / "examples" / "raw"

Turn = tuple[str, list[int]]


def build(convs: list[list[Turn]], *, user_header: int = 1, eos: bool = True) -> tuple[list, list, TurnSpans]:
    """Token ids, seed-001 loss masks (assistant marker through <|END|>) and spans of conversations."""
    docs, masks, spans = [], [], []
    for d, conv in enumerate(convs):
        ids: list[int] = []
        mask: list[bool] = []
        for role, content in conv:
            header = [MARKERS[role]] + ([PAD_HEADER] * (user_header - 1) if role == "user" else [])
            turn = header + content + [END]
            spans.append((d, len(ids), len(ids) + len(turn), CODES[role], len(header)))
            ids += turn
            mask += [role == "assistant"] * len(turn)
        docs.append(ids + [EOS] * eos)
        masks.append(mask + [False] * eos)
    cols = [np.array(c, dtype=np.int64) for c in zip(*spans, strict=True)] if spans else [np.zeros(0, np.int64)] * 5
    turns = TurnSpans(doc=cols[0], start=cols[1], end=cols[2], role=cols[3].astype(np.int8), header_len=cols[4])
    return docs, masks, turns


def run(convs: list[list[Turn]], seq_len: int, **kw: int) -> tuple[Packing, list, list]:
    docs, masks, turns = build(convs, **kw)
    return stream(np.array([len(d) for d in docs]), seq_len=seq_len, turns=turns), docs, masks


def blocks(packing: Packing, docs: list, masks: list) -> list[tuple[list[int], list[bool]]]:
    """Each block's token ids and effective loss mask (the data's mask where the piece is trained)."""
    out: list[tuple[list[int], list[bool]]] = [([], []) for _ in range(packing.num_packs)]
    for d, s, n, k, t in zip(packing.doc, packing.start, packing.length, packing.pack, packing.trained, strict=True):
        out[k][0].extend(docs[d][s : s + n])
        out[k][1].extend(m and bool(t) for m in masks[d][s : s + n])
    return out


# The seed's Example, verbatim; words are byte tokens (s0 = [115, 48]) as with etl's `bytes`
# tokenizer, so each turn is 4 tokens: u2 is tokens 20..23, a2 24..27, <|EOS|> 28.
SEED_EXAMPLE = """
<|SYSTEM|> s0 <|END|>
<|USER|> u0 <|END|>
<|ASSISTANT|> a0 <|END|>
<|USER|> u1 <|END|>
<|ASSISTANT|> a1 <|END|>
<|USER|> u2 <|END|>
<|ASSISTANT|> a2 <|END|>
"""
SPECIAL = {"<|SYSTEM|>": SYS, "<|USER|>": USR, "<|ASSISTANT|>": AST, "<|END|>": END, "<|EOS|>": EOS}
ROLES = {SYS: "system", USR: "user", AST: "assistant"}
F, T = False, True


def encode(text: str) -> list[int]:
    return [t for word in text.split() for t in ([SPECIAL[word]] if word in SPECIAL else list(word.encode()))]


def parse(text: str) -> list[Turn]:
    """The (role, content) turns of ``<|X|> content <|END|>`` lines."""
    return [(ROLES[ids[0]], ids[1:-1]) for ids in map(encode, text.strip().splitlines())]


EXAMPLE = parse(SEED_EXAMPLE)


def test_seed_example_cut_inside_u2_starts_the_next_block_with_system_and_user() -> None:
    packing, docs, masks = run([EXAMPLE], seq_len=22)  # block 0 ends inside u2, after its "u"
    (ids0, mask0), (ids1, mask1) = blocks(packing, docs, masks)
    assert docs[0] == encode(SEED_EXAMPLE + "<|EOS|>") and ids0 == docs[0][:22]
    assert mask0 == [F] * 4 + ([F] * 4 + [T] * 4) * 2 + [F] * 2  # a0, a1: their users complete
    # "<|SYSTEM|> s0 <|END|> <|USER|> u2 ...": the injection, then the stream where it was cut.
    assert ids1 == encode("<|SYSTEM|> s0 <|END|> <|USER|>") + docs[0][22:]
    assert ids1 == encode("<|SYSTEM|> s0 <|END|> <|USER|> 2 <|END|> <|ASSISTANT|> a2 <|END|> <|EOS|>")
    assert mask1 == [F] * 12  # a2 masked: the full <|USER|> u2 <|END|> is not in this block
    assert packing.trained.tolist() == [T, F, F, T, F, T]  # injected system, header; a2's piece
    assert packing.pack_tokens().tolist() == [22, 12]
    packing, docs, masks = run([EXAMPLE], seq_len=23)  # cut before u2's <|END|>: same rule
    assert blocks(packing, docs, masks)[1] == (
        encode("<|SYSTEM|> s0 <|END|> <|USER|> <|END|> <|ASSISTANT|> a2 <|END|> <|EOS|>"), [F] * 11
    )


def test_seed_example_a2_trained_when_the_full_u2_is_in_the_block() -> None:
    packing, docs, masks = run([EXAMPLE], seq_len=20)  # the boundary falls on u2's <|USER|>
    (_, _), (ids1, mask1) = blocks(packing, docs, masks)
    assert ids1 == encode("<|USER|> u2 <|END|> <|ASSISTANT|> a2 <|END|> <|EOS|>")  # not inside: as is
    assert mask1 == [F] * 4 + [T] * 4 + [F]
    packing, docs, masks = run([EXAMPLE], seq_len=29)  # one block: every assistant trained
    assert blocks(packing, docs, masks) == [(docs[0], [F] * 4 + ([F] * 4 + [T] * 4) * 3 + [F])]


def test_no_system_span_no_injection() -> None:
    conv = [("user", [1, 2]), ("assistant", [3]), ("user", [4, 5, 6]), ("assistant", [7])]
    packing, docs, masks = run([conv], seq_len=9)  # block 0 ends at 5, inside the second user
    assert [ids for ids, _ in blocks(packing, docs, masks)] == [
        [USR, 1, 2, END, AST, 3, END, USR, 4],
        [USR, 5, 6, END, AST, 7, END, EOS],
    ]


def test_history_resets_at_eos_the_next_document_gets_no_system_span() -> None:
    first = [("system", [10]), ("user", [1]), ("assistant", [2])]  # 10 tokens with EOS
    second = [("user", [3, 4, 5]), ("assistant", [6])]
    packing, docs, masks = run([first, second], seq_len=12)  # cut after 3: inside second's user
    ids = [b[0] for b in blocks(packing, docs, masks)]
    assert ids == [[SYS, 10, END, USR, 1, END, AST, 2, END, EOS, USR, 3], [USR, 4, 5, END, AST, 6, END, EOS]]
    assert set(packing.doc[packing.pack == 1].tolist()) == {1}  # the header comes from doc 1 itself


def test_block_starting_mid_user_and_ending_before_its_end_stops_that_document() -> None:
    long_user = [("system", [10]), ("user", list(range(20))), ("assistant", [50])]
    other = [("user", [1]), ("assistant", [2])]
    packing, docs, masks = run([long_user, other], seq_len=8)
    out = blocks(packing, docs, masks)
    # Block 1 starts at user token 3 and ends before <|END|>: the rest of document 0 is skipped.
    assert [ids for ids, _ in out] == [
        [SYS, 10, END, USR, 0, 1, 2, 3],
        [SYS, 10, END, USR, 4, 5, 6, 7],
        [USR, 1, END, AST, 2, END, EOS],
    ]
    assert out[2][1] == [F, F, F, T, T, T, F]


def test_unmatched_assistant_is_masked_and_so_is_its_continuation() -> None:
    conv = [("user", [1]), ("assistant", [2, 3, 4, 5])]  # assistant = tokens 3..8
    packing, docs, masks = run([conv, conv], seq_len=6)
    out = blocks(packing, docs, masks)
    assert out[0] == ([USR, 1, END, AST, 2, 3], [F] * 6)  # <|ASSISTANT|> without its <|END|>
    assert out[1] == ([4, 5, END, EOS, USR, 1], [F] * 6)  # the continuation: no user in the block
    # Second document: cut on its user's <|END|>, so rewritten, and its assistant unmatched again.
    assert out[2] == ([USR, END, AST, 2, 3, 4], [F] * 6)
    assert out[3] == ([5, END, EOS], [F] * 3)


def test_assistant_with_its_complete_user_in_the_block_is_trained() -> None:
    conv = [("system", [9]), ("user", [1]), ("assistant", [2, 3])]
    packing, docs, masks = run([conv, conv], seq_len=11)
    out = blocks(packing, docs, masks)
    assert out[0] == ([SYS, 9, END, USR, 1, END, AST, 2, 3, END, EOS], [F] * 6 + [T] * 4 + [F])
    assert packing.trained.all()


def test_assistant_without_a_user_before_it_and_no_assistant_at_all_are_masked() -> None:
    packing, docs, masks = run([[("assistant", [2])], [("system", [9]), ("user", [1])]], seq_len=64)
    (ids, mask), = blocks(packing, docs, masks)
    assert ids == [AST, 2, END, EOS, SYS, 9, END, USR, 1, END, EOS] and mask == [F] * 11


def test_cut_inside_a_multi_token_header_injects_its_part_before_the_cut() -> None:
    first = [("user", [7]), ("assistant", [8])]  # 9 tokens with a 3-token user header
    second = [("user", [1, 2]), ("assistant", [3])]  # 257 261 261 1 2 259 258 3 259 260
    packing, docs, masks = run([first, second], seq_len=10, user_header=3)
    out = blocks(packing, docs, masks)
    assert out[1][0] == [USR, PAD_HEADER, PAD_HEADER, 1, 2, END, AST, 3, END, EOS]  # header once
    assert out[1][1] == [F] * 10  # a rewritten user span stays incomplete: its assistant is masked
    one = packing.pack == 1
    assert packing.start[one].tolist()[:2] == [0, 1] and packing.length[one].tolist()[0] == 1
    assert packing.trained[one].tolist()[0] is False  # <|USER|> injected, the stream goes on at 1


def test_no_room_after_the_injection_skips_the_document_with_a_warning() -> None:
    big_system = [("system", [9, 9, 9, 9]), ("user", [1, 2, 3]), ("assistant", [4])]
    with pytest.warns(EtlWarning, match="skipped the rest of 1 documents"):
        packing, docs, masks = run([big_system, [("user", [5]), ("assistant", [6])]], seq_len=7)
    # Block 1 would start inside the user: system (6) + <|USER|> (1) fill all 7 tokens.
    assert [ids for ids, _ in blocks(packing, docs, masks)] == [
        [SYS, 9, 9, 9, 9, END, USR],
        [USR, 5, END, AST, 6, END, EOS],
    ]


# --- A token-level reference of seed 001, read from the markers, one token at a time ----------


def spans_of(ids: list[int]) -> list[tuple[int, int, int]]:
    """(marker, start, end) of every <|X|> ... <|END|> span (end exclusive; unmatched: to the end)."""
    out, open_at = [], None
    for i, t in enumerate(ids):
        if t in (SYS, USR, AST):
            open_at = (t, i)
        elif t == END and open_at is not None:
            out.append((open_at[0], open_at[1], i + 1))
            open_at = None
    return out + ([(open_at[0], open_at[1], len(ids))] if open_at else [])


def reference(docs: list[list[int]], masks: list[list[bool]], seq_len: int, header: int) -> list:
    """Blocks as (ids, effective mask) by the seed's rules, simulated token by token."""
    spans = [spans_of(ids) for ids in docs]
    out, d, p = [], 0, 0
    while d < len(docs):
        if p >= len(docs[d]):
            d, p = d + 1, 0
            continue
        user = [(s, e) for m, s, e in spans[d] if m == USR and s < p < e]
        taken: list[tuple[int, int, bool]] = []  # (doc, token, injected)
        if user:
            s = user[0][0]
            system = [(a, b) for m, a, b in spans[d] if m == SYS and b <= s][-1:]
            taken = [(d, i, True) for a, b in system for i in range(a, b)]
            taken += [(d, i, True) for i in range(s, min(p, s + header))]
            if len(taken) >= seq_len:
                d, p = d + 1, 0
                continue
        start_doc = d
        while len(taken) < seq_len and d < len(docs):
            if p < len(docs[d]):  # empty documents give nothing
                taken.append((d, p, False))
            d, p = (d + 1, 0) if p + 1 >= len(docs[d]) else (d, p + 1)
        if user and d == start_doc and p < user[0][1]:  # ended before the user's end: stop the doc
            d, p = d + 1, 0
        out.append(_effective(taken, docs, masks, spans))
    return out


def _effective(taken: list, docs: list, masks: list, spans: list) -> tuple[list[int], list[bool]]:
    here = {(d, i) for d, i, injected in taken if not injected}

    def whole(d: int, s: int, e: int) -> bool:
        return all((d, i) in here for i in range(s, e))

    mask = []
    for d, i, injected in taken:
        ok = masks[d][i] and not injected
        for m, s, e in spans[d]:
            if m == AST and s <= i < e:
                users = [(a, b) for m2, a, b in spans[d] if m2 == USR and a < s][-1:]
                ok = ok and e <= len(docs[d]) and docs[d][e - 1] == END and whole(d, s, e)
                ok = ok and bool(users) and whole(d, *users[0])
        mask.append(ok)
    return [docs[d][i] for d, i, _ in taken], mask


content = st.lists(st.integers(0, 255), max_size=5)
conversation = st.tuples(
    st.one_of(st.none(), content),  # system content, or no system
    st.lists(st.tuples(st.sampled_from(["user", "assistant"]), content), max_size=5),
).map(lambda c: ([("system", c[0])] if c[0] is not None else []) + c[1])


@settings(max_examples=150, deadline=None)
@given(
    convs=st.lists(conversation, min_size=1, max_size=6),
    seq_len=st.integers(1, 24),
    header=st.integers(1, 3),
    eos=st.booleans(),
)
def test_matches_the_token_level_reference_and_keeps_the_stream(convs: list, seq_len: int, header: int, eos: bool) -> None:
    docs, masks, turns = build(convs, user_header=header, eos=eos)
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EtlWarning)
        packing = stream(lengths, seq_len=seq_len, turns=turns)
    # The injected header's tokens in the reference: [USR] + PAD_HEADER..., parsed as one span.
    assert blocks(packing, docs, masks) == reference(docs, masks, seq_len, header)
    tokens = packing.pack_tokens()
    assert (tokens <= seq_len).all() and (tokens[:-1] == seq_len).all() and (packing.length >= 1).all()
    assert np.array_equal(packing.pack, np.sort(packing.pack))
    check_stream(packing, lengths, turns)


def check_stream(packing: Packing, lengths: np.ndarray, turns: TurnSpans) -> None:
    """Without the injected pieces, the pieces are the documents in order minus skipped tails;
    injected pieces are untrained: the block's document's last system span before the user span
    the block starts strictly inside, and that user's header up to the cut."""
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    spans = list(zip(turns.doc, turns.start, turns.end, turns.role, turns.header_len, strict=True))
    cursor, injected = 0, []
    for d, s, n, t in zip(packing.doc, packing.start, packing.length, packing.trained, strict=True):
        at = offsets[d] + s
        if at < cursor:  # repeats tokens already passed: an injection in front of the block
            assert not t
            injected.append((d, s, s + n))
            continue
        if at > cursor:  # a skipped tail: the rest of the cursor's document, cut mid-document
            doc = np.searchsorted(offsets, cursor, side="right") - 1
            assert offsets[doc] < cursor and at == offsets[doc + 1]
        if injected:
            (user,) = [(us, ue, h) for ud, us, ue, r, h in spans if ud == d and r == ROLE_USER and us < s < ue]
            system = [(d, ss, se) for sd, ss, se, r, _ in spans if sd == d and r == ROLE_SYSTEM and se <= user[0]]
            assert injected == system[-1:] + [(d, user[0], min(s, user[0] + user[2]))]
            injected = []
        cursor = at + n
    assert not injected
    if cursor != offsets[-1]:  # the last document's tail was skipped
        doc = np.searchsorted(offsets, cursor, side="right") - 1
        assert offsets[doc] < cursor and offsets[doc + 1] == offsets[-1]


@pytest.fixture(scope="module")
def post_training_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/raw through `etl run --template post_training` (17 examples, 2,360 tokens)."""
    dst = tmp_path_factory.mktemp("stream") / "dst"
    assert main(["run", str(RAW), str(dst), "--template", "post_training"]) == 0
    return dst


@pytest.mark.parametrize("seq_len", [48, 100, 257])
def test_post_training_run_through_turn_spans_matches_the_reference(post_training_run: Path, seq_len: int) -> None:
    dst = post_training_run
    data = ds.dataset(dst / "data" / "train").to_table(columns=["id", "input_ids", "loss_mask", "num_tokens"])
    turns = turn_spans(
        ds.dataset(dst / "turns" / "train").to_table(),
        data.column("id"),
        header_len=header_lengths(json.loads((dst / "_manifest.json").read_text())),
    )
    docs, masks = data.column("input_ids").to_pylist(), data.column("loss_mask").to_pylist()
    assert all(ids[-1] == EOS for ids in docs)  # etl run appended the template's EOS
    packing = stream(data.column("num_tokens").to_numpy(), seq_len=seq_len, turns=turns)
    assert blocks(packing, docs, masks) == reference(docs, masks, seq_len, header=1)
    assert (~packing.trained).any() and packing.trained.any()
    check_stream(packing, data.column("num_tokens").to_numpy().astype(np.int64), turns)


def test_turns_outside_the_lengths_are_an_error() -> None:
    _, _, turns = build([EXAMPLE])
    with pytest.raises(EtlError, match="outside the documents"):
        stream(np.array([20]), seq_len=8, turns=turns)
    with pytest.raises(EtlError, match="seq_len"):
        stream(np.array([27]), seq_len=0, turns=turns)
