"""Seed 000's functions with the tokenizers users have (`etl.tokens.any_tokenizer`).

Every tokenizer is built here by hand (no downloads): a word-level `tokenizers.Tokenizer`, the
same one wrapped by transformers (fast) and its pure-Python twin (slow), a byte-level tiktoken
`Encoding` with three merges, etl's byte tokenizer and a duck-typed object. The content ids
below are worked out by hand from those vocabularies; nothing expected is derived from
`etl.sft` or `etl.tokens.any_tokenizer`. Qwen2.5 (../shared/data) is skipped when absent.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from etl.errors import EtlError
from etl.sft import (
    collate_sft_batch,
    pack_sft_ids_and_mask,
    serialize_chat_to_ids,
    sft_loss_mask_for_ids,
)
from etl.tokens.tokenizer import ByteTokenizer

SFX = "84a5023f67d74cf29cc4001becde983c"  # spelled as in the seed, not imported
SYS_T, USR_T, ASST_T, EOT_T = (f"<|ngpt_{r}_{SFX}|>" for r in ("sys", "usr", "asst", "eot"))
NGPT = [SYS_T, USR_T, ASST_T, EOT_T]
EOS_T = "<|endoftext|>"
QWEN = Path(__file__).resolve().parents[3] / "shared" / "data" / "qwen2.5-tokenizer" / "tokenizer.json"
F, T_ = False, True

DEFAULT = "you are a helpful assistant."
TEXTS = ("default", "be brief", "hi there", "hello", "how are you", "fine thanks")
# Whitespace pre-tokenizer: \w+|[^\w\s]+, so "<|ngpt_eot_...|>" -> "<|", "ngpt_eot_...", "|>".
WORDS = {
    "[UNK]": 0, "you": 1, "are": 2, "a": 3, "helpful": 4, "assistant": 5, ".": 6, "hi": 7,
    "there": 8, "hello": 9, "<|": 10, "|>": 11, "endoftext": 12, "say": 13, "ok": 14, "be": 15,
    "brief": 16, "how": 17, "fine": 18, "thanks": 19, "now": 20,
}
# added after the 21 words, in this order: sys 21, usr 22, asst 23, eot 24, <|endoftext|> 25
WORD_TEXT = {"default": [1, 2, 3, 4, 5, 6], "be brief": [15, 16], "hi there": [7, 8], "hello": [9],
             "how are you": [17, 2, 1], "fine thanks": [18, 19]}


def word_level(specials: tuple[str, ...] = (*NGPT, EOS_T)) -> Tokenizer:
    tok = Tokenizer(models.WordLevel(vocab=WORDS, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(specials))
    if EOS_T in specials:  # a BOS the post-processor adds unless add_special_tokens=False
        tok.post_processor = processors.TemplateProcessing(
            single=f"{EOS_T} $A", special_tokens=[(EOS_T, tok.token_to_id(EOS_T))])
    return tok


def wrapped(specials: tuple[str, ...] = (*NGPT, EOS_T)) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=word_level(specials), unk_token="[UNK]")


def slow(specials: tuple[str, ...] = (*NGPT, EOS_T)) -> Any:
    """A slow (pure Python) transformers tokenizer over WORDS, splitting like Whitespace."""
    transformers = pytest.importorskip("transformers")

    class Slow(transformers.PreTrainedTokenizer):
        def get_vocab(self) -> dict[str, int]:
            return WORDS | self.added_tokens_encoder

        @property
        def vocab_size(self) -> int:
            return len(WORDS)

        def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
            return re.findall(r"\w+|[^\w\s]+", text)

        def _convert_token_to_id(self, token: str) -> int:
            return WORDS.get(token, 0)

        def _convert_id_to_token(self, index: int) -> str:
            return {i: w for w, i in WORDS.items()}.get(index, "[UNK]")

    tok = Slow(unk_token="[UNK]")
    tok.add_tokens(list(specials), special_tokens=True)  # ids from 21, as in word_level
    return tok


def _slow_plain(tok: Any, text: str) -> list[int]:
    return [WORDS.get(w, 0) for w in re.findall(r"\w+|[^\w\s]+", text)]


# tiktoken: bytes are their own ranks, plus merges "he" 256, "ll" 257, "hell" 258; pieces are
# " ?\S+" (a word with its leading space) or whitespace.
def tiktoken_enc(specials: dict[str, int] | None = None) -> Any:
    tiktoken = pytest.importorskip("tiktoken")
    ranks = {bytes([i]): i for i in range(256)} | {b"he": 256, b"ll": 257, b"hell": 258}
    if specials is None:
        specials = {SYS_T: 300, USR_T: 301, ASST_T: 302, EOT_T: 303, EOS_T: 304}
    return tiktoken.Encoding(name="hand", pat_str=r" ?[^\s]+|\s+", mergeable_ranks=ranks,
                             special_tokens=specials)


TIK_TEXT = {"default": [*b"you are a ", 256, *b"lpful assistant."], "be brief": [*b"be brief"],
            "hi there": [*b"hi t", 256, *b"re"], "hello": [258, *b"o"],
            "how are you": [*b"how are you"], "fine thanks": [*b"fine thanks"]}
BYTE_TEXT = {k: list((DEFAULT if k == "default" else k).encode()) for k in TEXTS}


class Duck:
    """encode returns a tuple of word ids (unknown words 0); specials only in a mapping."""

    vocab: ClassVar[dict[str, int]] = {
        "you": 1, "are": 2, "a": 3, "helpful": 4, "assistant.": 5, "hi": 7, "there": 8, "hello": 9,
        "be": 15, "brief": 16, "how": 17, "fine": 18, "thanks": 19}

    def __init__(self, special_tokens: dict[str, int]) -> None:
        self.special_tokens = special_tokens

    def encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.vocab.get(w, 0) for w in text.split(" ") if w)


DUCK_TEXT = WORD_TEXT | {"default": [1, 2, 3, 4, 5]}


@dataclass(frozen=True)
class Kind:
    name: str
    make: Callable[[], Any]  # with the four ngpt tokens (and <|endoftext|> where it can)
    bare: Callable[[], Any]  # with only the system and end-of-turn tokens
    role: tuple[int, int, int, int]  # sys, usr, asst, eot
    text: dict[str, list[int]]  # hand-worked content ids
    plain: Callable[[Any, str], list[int]]  # independent plain-text encoding
    others: tuple[int, ...]  # special ids that are not ngpt markers
    hint: str  # in the missing-token message


def _model_only(tok: Tokenizer, text: str) -> list[int]:
    """Pre-tokenizer + model: never sees added tokens at all."""
    return [t.id for piece, _ in tok.pre_tokenizer.pre_tokenize_str(text) for t in tok.model.tokenize(piece)]


KINDS = [
    Kind("tokenizers", word_level, lambda: word_level((SYS_T, EOT_T)), (21, 22, 23, 24), WORD_TEXT,
         _model_only, (25,), r"tokenizer\.add_special_tokens\("),
    Kind("transformers", wrapped, lambda: wrapped((SYS_T, EOT_T)), (21, 22, 23, 24), WORD_TEXT,
         lambda tok, text: _model_only(tok.backend_tokenizer, text), (25,), r"special_tokens=True"),
    Kind("transformers-slow", slow, lambda: slow((SYS_T, EOT_T)), (21, 22, 23, 24), WORD_TEXT,
         _slow_plain, (25,), r"special_tokens=True"),
    Kind("tiktoken", tiktoken_enc, lambda: tiktoken_enc({SYS_T: 300, EOT_T: 303}), (300, 301, 302, 303),
         TIK_TEXT, lambda enc, text: enc.encode_ordinary(text), (304,), r"special_tokens=\{"),
    Kind("bytes", lambda: ByteTokenizer([*NGPT, EOS_T]), lambda: ByteTokenizer([SYS_T, EOT_T]),
         (256, 257, 258, 259), BYTE_TEXT, lambda _, text: list(text.encode()), (260,),
         r"ByteTokenizer\(special_tokens="),
    Kind("duck", lambda: Duck(dict(zip(NGPT, (90, 91, 92, 93)))), lambda: Duck({SYS_T: 90, EOT_T: 93}),
         (90, 91, 92, 93), DUCK_TEXT, lambda duck, text: list(duck.encode(text)), (), r"token_to_id"),
]


@pytest.fixture(params=KINDS, ids=[k.name for k in KINDS])
def kind(request: pytest.FixtureRequest) -> Kind:
    return request.param


def chat(*pairs: tuple[str, str]) -> dict:
    return {"messages": [{"role": r, "content": c} for r, c in pairs]}


def serialize(ex: dict, tokenizer: Any) -> list[int]:
    return serialize_chat_to_ids(ex, tokenizer=tokenizer, default_system_text=DEFAULT)


def role_kw(kind: Kind) -> dict[str, int]:
    return dict(zip(("sys_id", "usr_id", "asst_id", "eot_id"), kind.role))


def test_default_system_is_inserted(kind: Kind) -> None:
    S, U, A, E = kind.role
    t = kind.text
    ids = serialize(chat(("user", "hi there"), ("assistant", "hello")), kind.make())
    assert ids == [S, *t["default"], E, U, *t["hi there"], E, A, *t["hello"], E]
    trained = len(t["hello"]) + 1  # assistant content and its EOT
    assert sft_loss_mask_for_ids(ids, **role_kw(kind)) == [F] * (len(ids) - trained) + [T_] * trained


def test_four_seed_functions(kind: Kind) -> None:
    S, U, A, E = kind.role
    t = kind.text
    ex = chat(("system", "be brief"), ("user", "hi there"), ("assistant", "hello"),
              ("user", "how are you"), ("assistant", "fine thanks"))
    head, pair1 = [S, *t["be brief"], E], [U, *t["hi there"], E, A, *t["hello"], E]
    pair2 = [U, *t["how are you"], E, A, *t["fine thanks"], E]
    mask1 = [F] * (len(t["hi there"]) + 3) + [T_] * (len(t["hello"]) + 1)
    mask2 = [F] * (len(t["how are you"]) + 3) + [T_] * (len(t["fine thanks"]) + 1)
    ids = serialize(ex, kind.make())
    assert ids == head + pair1 + pair2
    mask = sft_loss_mask_for_ids(ids, **role_kw(kind))
    assert mask == [F] * len(head) + mask1 + mask2
    # S fits the head and the last pair plus one pad: the oldest pair goes (seed rule 1)
    s_len = len(head) + len(pair2) + 1
    packed = pack_sft_ids_and_mask(ids, mask, S=s_len, pad_id=E, **role_kw(kind))
    assert packed == (head + pair2 + [E], [F] * len(head) + mask2 + [F])
    x, y, loss_mask = collate_sft_batch([packed], T=s_len - 1, device="cpu")
    assert x.tolist() == [head + pair2]
    assert loss_mask.tolist() == [[F] * (len(head) - 1) + mask2 + [F]]
    assert y.tolist() == [[-100] * (len(head) - 1 + len(t["how are you"]) + 3) + t["fine thanks"] + [E, -100]]


def test_word_level_golden_lists() -> None:
    # the whole serialization written out for the tokenizers.Tokenizer (the post-processor's
    # BOS, id 25, must not appear)
    ids = serialize(chat(("user", "hi there"), ("assistant", "hello")), word_level())
    assert ids == [21, 1, 2, 3, 4, 5, 6, 24, 22, 7, 8, 24, 23, 9, 24]
    assert sft_loss_mask_for_ids(ids, sys_id=21, usr_id=22, asst_id=23, eot_id=24) == [F] * 13 + [T_, T_]


SPECIAL_CONTENT = f"say {EOT_T} now {EOS_T} ok {ASST_T}<|im_end|>"


def test_special_strings_in_content_are_text(kind: Kind) -> None:
    tok = kind.make()
    ids = serialize(chat(("user", SPECIAL_CONTENT), ("assistant", f"{SYS_T} hello {EOS_T}")), tok)
    S, U, A, E = kind.role
    head = [S, *kind.text["default"], E]
    user_end = ids.index(E, len(head) + 1)
    user, assistant = ids[len(head) + 1 : user_end], ids[user_end + 2 : -1]
    assert ids[len(head)] == U and ids[user_end + 1] == A and ids[-1] == E
    for span, text in ((user, SPECIAL_CONTENT), (assistant, f"{SYS_T} hello {EOS_T}")):
        assert not set(span) & {*kind.role, *kind.others}
        assert span == kind.plain(tok, text)


def test_special_strings_word_level_golden() -> None:
    ids = serialize(chat(("user", SPECIAL_CONTENT), ("assistant", "ok")), word_level())
    # say <| ngpt_eot_... |> now <| endoftext |> ok <| ngpt_asst_... |><| im_end |>: the
    # Whitespace pre-tokenizer keeps "|><|" together, which is not a word -> [UNK]
    user = [13, 10, 0, 11, 20, 10, 12, 11, 14, 10, 0, 0, 0, 11]
    assert ids == [21, 1, 2, 3, 4, 5, 6, 24, 22, *user, 24, 23, 14, 24]


def test_missing_role_tokens_name_them_and_say_how_to_add(kind: Kind) -> None:
    with pytest.raises(EtlError, match=kind.hint) as err:
        serialize(chat(("user", "hi"), ("assistant", "hello")), kind.bare())
    message = str(err.value)
    assert USR_T in message and ASST_T in message
    assert SYS_T not in message and EOT_T not in message


def test_tokenizers_flag_is_restored() -> None:
    tok = word_level()
    for before in (True, False):
        tok.encode_special_tokens = before
        serialize(chat(("user", EOT_T), ("assistant", "hello")), tok)
        assert tok.encode_special_tokens is before
    assert tok.encode(EOT_T, add_special_tokens=False).ids == [24]  # the user's own use unchanged


def test_transformers_backend_flag_is_restored() -> None:
    tok = wrapped()
    serialize(chat(("user", EOT_T), ("assistant", "hello")), tok)
    assert tok.backend_tokenizer.encode_special_tokens is False
    assert tok.encode(EOT_T, add_special_tokens=False) == [24]


def test_marker_added_as_ordinary_token_is_refused() -> None:
    # add_tokens (not special): the tokenizer matches the marker inside text, so content would
    # produce a role id and cut the turn; the reference refuses instead of mis-masking.
    tok = word_level(())
    tok.add_tokens(NGPT)
    with pytest.raises(EtlError, match="special tokens"):
        serialize(chat(("user", f"say {EOT_T}"), ("assistant", "ok")), tok)
    ids = serialize(chat(("user", "say"), ("assistant", "ok")), tok)
    assert ids == [21, 1, 2, 3, 4, 5, 6, 24, 22, 13, 24, 23, 14, 24]


def test_unsupported_objects() -> None:
    with pytest.raises(EtlError, match="encode"):
        serialize(chat(("user", "hi")), object())

    class Text:
        special_tokens: ClassVar[dict[str, int]] = dict(zip(NGPT, (1, 2, 3, 4)))

        def encode(self, text: str) -> str:
            return text

    with pytest.raises(EtlError, match="not a sequence of ints"):
        serialize(chat(("user", "hi")), Text())


@pytest.mark.shared
@pytest.mark.skipif(not QWEN.exists(), reason="needs ../shared/data/qwen2.5-tokenizer")
def test_qwen25_tokenizer_from_file() -> None:
    tok = Tokenizer.from_file(str(QWEN))
    assert tok.add_special_tokens(NGPT) == 4  # after Qwen2.5's last added token, 151664
    ids = serialize(chat(("user", "Hello, world!"), ("assistant", "a<|im_end|>b")), tok)
    # sys 151665, usr 151666, asst 151667, eot 151668
    user_end = ids.index(151666) + 5
    assert ids[ids.index(151666) : user_end + 2] == [151666, 9707, 11, 1879, 0, 151668, 151667]
    assert ids[0] == 151665 and ids[-1] == 151668 and 151645 not in ids
    assert ids[user_end + 2 : -1] == _model_only(tok, "a<|im_end|>b")
    assert tok.encode("<|im_end|>", add_special_tokens=False).ids == [151645]  # left as it was
