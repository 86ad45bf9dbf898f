"""Token display strings (characters split over several tokens show whole, specials by name),
and the copy of ids out of `tokenizers` Encodings."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.tokens.hf_tokenizer import HFTokenizer, flatten_ids
from etl.tokens.token_display import join_utf8_pieces
from etl.tokens.tokenizer import IDS_TIMING

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
TEXT = "日本語のテキスト 🧑\u200d🚀 𝔘 héllo"


class Names:
    def id_to_token(self, i: int) -> str:
        return f"<special {i}>"


def test_pieces_of_one_character_are_joined_on_its_first_token() -> None:
    e, h = "日".encode(), "é".encode()
    pieces = [e[:1], e[1:2], e[2:], b"a", h[:1], h[1:], None, b"\xff"]
    assert join_utf8_pieces(pieces, list(range(8)), Names()) == ["日", "", "", "a", "é", "", "<special 6>", "\ufffd"]


@pytest.mark.parametrize("name", ["qwen2.5-tokenizer", "phi3-tokenizer"])
def test_real_tokenizers_display_text_that_joins_back(name: str) -> None:
    if not (SHARED / name).exists():
        pytest.skip(f"needs ../shared/data/{name}")
    tok = HFTokenizer(SHARED / name)
    ids = tok.encode_texts(pa.array([TEXT]))[0].as_py()
    strings = tok.token_strings(ids)
    assert len(strings) == len(ids)
    assert "".join(strings).strip() == TEXT and "\ufffd" not in "".join(strings)


# --- copying ids out of tokenizers' Encodings ---------------------------------------------


class FakeEncoding:
    """What `flatten_ids` reads of a `tokenizers.Encoding`: `.ids` (a fresh list) and len()."""

    def __init__(self, ids: list[int]) -> None:
        self._ids = ids

    @property
    def ids(self) -> list[int]:
        return list(self._ids)

    def __len__(self) -> int:
        return len(self._ids)


def flatten_before(batch: list) -> tuple[np.ndarray, np.ndarray]:
    """The copy `flatten_ids` replaced (kept in bench/hot_path.py too): every list, then fromiter."""
    ids = [enc.ids for enc in batch]
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    return np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum())), lengths


def assert_same_copy(batch: list) -> None:
    flat, lengths = flatten_ids(batch)
    old_flat, old_lengths = flatten_before(batch)
    assert flat.dtype == np.int32 and lengths.dtype == np.int64
    assert flat.tobytes() == old_flat.tobytes() and lengths.tobytes() == old_lengths.tobytes()
    assert np.array_equal(flat, [i for enc in batch for i in enc.ids])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**31 - 1), max_size=40), max_size=30))
def test_flatten_ids_equals_the_old_copy_on_random_id_lists(id_lists: list[list[int]]) -> None:
    assert_same_copy([FakeEncoding(ids) for ids in id_lists])


WORDS = ["", "a", "b", "cat", "dog", "the", "zz"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.sampled_from(WORDS), max_size=12).map(" ".join), max_size=20))
def test_flatten_ids_equals_the_old_copy_on_real_encodings(texts: list[str]) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i * 70_000 for i, w in enumerate(WORDS)}, unk_token=""))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    assert_same_copy(tok.encode_batch_fast(texts, add_special_tokens=False))


def test_encode_texts_reports_the_ids_copy_apart(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token=""))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    timings: Counter[str] = Counter()
    ids = HFTokenizer(tmp_path).encode_texts(pa.array(["the cat", "", "dog a"]), timings=timings)
    assert ids.to_pylist() == [[5, 3], [], [4, 1]]
    assert set(timings) == {IDS_TIMING} and timings[IDS_TIMING] >= 0
