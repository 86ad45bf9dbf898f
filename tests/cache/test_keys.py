"""`etl.cache.keys`: the cache key of a text is its MD5 (checked against hashlib), and `distinct`
finds exactly the repeats of a batch (checked by rebuilding the batch from its answer)."""

from __future__ import annotations

import hashlib

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.cache.keys import content_keys, distinct

CON = duckdb.connect()  # one per module: connecting per Hypothesis example would dominate the run


@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    return CON


def md5_words(text: str) -> bytes:
    return hashlib.md5(text.encode("utf-8")).digest()


def as_digest(key: np.ndarray) -> bytes:
    """A key row (two uint64 words) as the 16 bytes they hold, little-endian words in order."""
    assert key.dtype == np.uint64 and key.shape == (2,)
    return key.astype("<u8").tobytes()


CASES = {
    "ascii": ["hello", "Hello", "a", " "],
    "unicode": ["数据 模型", "café", "\U0001f600 emoji", "a\x00b", "Ünïcödé\n\t"],
    "empty": ["", "x", ""],
    "long": ["the quick brown fox " * 50_000, "z" * 1_000_003],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_content_keys_are_md5_digests(name: str, con: duckdb.DuckDBPyConnection) -> None:
    """Each row of content_keys is the text's MD5 digest, its 16 bytes read as two little-endian
    uint64 words: the same 16 bytes hashlib gives, for ascii, unicode (incl. NUL), empty and
    multi-megabyte strings."""
    texts = CASES[name]
    keys = content_keys(pa.array(texts), con)
    assert keys.shape == (len(texts), 2) and keys.dtype == np.uint64
    assert [as_digest(k) for k in keys] == [md5_words(t) for t in texts]


def test_content_keys_of_a_known_text(con: duckdb.DuckDBPyConnection) -> None:
    """A hand-checked value: md5("") = d41d8cd98f00b204e9800998ecf8427e."""
    key = content_keys(pa.array([""]), con)[0]
    assert as_digest(key).hex() == "d41d8cd98f00b204e9800998ecf8427e"
    assert int(key[0]) == int.from_bytes(bytes.fromhex("d41d8cd98f00b204"), "little")


@pytest.mark.parametrize("type_", [pa.string(), pa.large_string()])
def test_content_keys_of_a_sliced_array(type_: pa.DataType, con: duckdb.DuckDBPyConnection) -> None:
    """A slice (offset != 0, values buffer shared with the parent) keys only its own rows."""
    parent = pa.array(["skip me", "数据", "", "tail", "also skipped"], type_)
    part = parent.slice(1, 3)
    assert part.offset == 1
    keys = content_keys(part, con)
    assert [as_digest(k) for k in keys] == [md5_words(t) for t in ["数据", "", "tail"]]


def test_content_keys_of_no_texts(con: duckdb.DuckDBPyConnection) -> None:
    """Zero texts: a (0, 2) uint64 array."""
    keys = content_keys(pa.array([], pa.string()), con)
    assert keys.shape == (0, 2) and keys.dtype == np.uint64


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.text(max_size=30), max_size=40), start=st.integers(0, 5))
def test_content_keys_match_hashlib(texts: list[str], start: int) -> None:
    """Any strings, sliced at any start: content_keys == hashlib.md5 of each, row for row."""
    arr = pa.array(["pad"] * start + texts, pa.large_string()).slice(start)
    assert [as_digest(k) for k in content_keys(arr, CON)] == [md5_words(t) for t in texts]


def test_distinct_by_hand() -> None:
    """["a", "b", "a", "", "b", ""]: firsts [0, 1, 3], each row's number [0, 1, 0, 2, 1, 2]."""
    firsts, inverse = distinct(pa.array(["a", "b", "a", "", "b", ""]))
    assert firsts.tolist() == [0, 1, 3]
    assert inverse.tolist() == [0, 1, 0, 2, 1, 2]


def test_distinct_is_none_when_nothing_repeats() -> None:
    """All distinct (even strings that differ only after a NUL): None."""
    assert distinct(pa.array(["a", "b", "", "a\x00b", "a\x00c"])) is None
    assert distinct(pa.array([], pa.string())) is None


@settings(max_examples=150, deadline=None)
@given(pool=st.lists(st.text(alphabet="ab数\x00 ", max_size=4), min_size=1, max_size=6, unique=True),
       picks=st.lists(st.integers(0, 5), max_size=30), start=st.integers(0, 3))
def test_distinct_rebuilds_the_batch(pool: list[str], picks: list[int], start: int) -> None:
    """For any batch (repeats drawn from a small pool, sliced at any start): texts[firsts] are
    distinct, each is its text's first occurrence in order, and texts[firsts][inverse] == texts;
    None exactly when no text repeats."""
    texts = [pool[i % len(pool)] for i in picks]
    arr = pa.array(["pad"] * start + texts).slice(start)
    got = distinct(arr)
    if len(set(texts)) == len(texts):
        assert got is None
        return
    assert got is not None
    firsts, inverse = got
    uniques = [texts[i] for i in firsts]
    assert uniques == list(dict.fromkeys(texts))  # first occurrences, in order of appearance
    assert firsts.tolist() == [texts.index(u) for u in uniques]
    assert [uniques[j] for j in inverse] == texts
    # The same through pyarrow, as the encoder uses them.
    assert arr.take(pa.array(firsts)).take(pa.array(inverse)).to_pylist() == texts


def test_content_keys_keep_row_order_over_parallel_batches(con: duckdb.DuckDBPyConnection,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch cut in several record batches for DuckDB's threads (small SPLIT_ROWS, many rows,
    a sliced input) still gives row i the MD5 of text i."""
    from etl.formats import builders as registry

    monkeypatch.setattr(registry, "SPLIT_ROWS", 16)
    monkeypatch.setattr(registry.os, "cpu_count", lambda: 4)
    texts = [f"text {i} " * (i % 7) for i in range(3000)]
    arr = pa.array(["pad", "pad"] + texts, pa.large_string()).slice(2)
    assert [as_digest(k) for k in content_keys(arr, con)] == [md5_words(t) for t in texts]
