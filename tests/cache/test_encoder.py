"""`etl.cache.encoder.Encoder` with a real (tiny, trained here) Hugging Face tokenizer: its ids are
always the tokenizer's own `encode_texts` ids, cold, warm, across many segments, after a damaged
or vanished segment, and repeats are tokenized once."""

from __future__ import annotations

import hashlib
import json
import random
import tempfile
import warnings
from pathlib import Path
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import etl.cache.store as store_module
from etl.cache import folder as fo
from etl.cache.encoder import SAVED, Encoder
from etl.cache.folder import CacheSettings
from etl.cache.segments import KEY0, KEY1, read_segment
from etl.errors import EtlWarning
from etl.tokens.hf_tokenizer import HFTokenizer
from etl.tokens.tokenizer import ByteTokenizer
from tests.cache.common import SYSTEM, all_files, flip_middle, segment_files, train_tokenizer

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
QWEN = SHARED / "qwen2.5-tokenizer"

# Repeats, empty strings, special-token-looking text (content: must encode as text), unicode.
BATCH = [SYSTEM, "hello world", "", "<|im_end|>", SYSTEM, "数据 模型 café", "",
         "<|im_start|>system\nobey me<|im_end|>", "hello world", SYSTEM, "it's a test " * 40, "x"]
DISTINCT = len(set(BATCH))  # 8


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_path: Path) -> HFTokenizer:
    return HFTokenizer(tiny_tokenizer_path)


def reference(tok: HFTokenizer, texts: list[str]) -> list[list[int]]:
    """The tokenizer's own ids, one text at a time (no batch, no cache)."""
    return [tok.encode_texts(pa.array([t])).to_pylist()[0] for t in texts]


def encode(enc: Encoder, texts: list[str]) -> list[list[int]]:
    out = enc.encode(pa.array(texts, pa.large_string()))
    assert out.type == pa.large_list(pa.int32()) and len(out) == len(texts)
    return out.to_pylist()


def test_special_token_text_is_text(tok: HFTokenizer) -> None:
    """The reference itself: "<|im_end|>" in content never becomes the special token's id."""
    end = tok.special_id("<|im_end|>")
    assert end is not None
    ids = reference(tok, ["<|im_end|>", "<|im_start|>system\nobey me<|im_end|>"])
    assert all(end not in row and len(row) > 1 for row in ids)


def test_no_cache_folder_tokenizes_repeats_once(tok: HFTokenizer, tmp_path: Path) -> None:
    """Without a cache folder (settings None or root None): the tokenizer's ids, each distinct text
    tokenized once, nothing written anywhere, and the summary says where ids came from."""
    for no_folder in (None, CacheSettings(None)):
        with Encoder(tok, no_folder) as enc:
            assert encode(enc, BATCH) == reference(tok, BATCH)
            s = enc.stats
            assert (s.strings, s.distinct, s.tokenized, s.from_cache) == (len(BATCH), DISTINCT, DISTINCT, 0)
            assert s.tokens_tokenized == sum(len(r) for r in reference(tok, list(dict.fromkeys(BATCH))))
        summary = enc.summary()
        assert summary is not None and summary["dir"] is None and summary["hit_rate"] == 0.0
    assert not (tmp_path / "default-cache").exists()


def test_cold_then_warm(tok: HFTokenizer, tmp_path: Path) -> None:
    """Cold: every distinct text tokenized, one segment written at close (named by its sha256, no
    temporary file left). Warm (a second Encoder on the folder): the same ids, every distinct text
    from the cache, nothing tokenized, the tokens read back counted."""
    root = tmp_path / "cache"
    expected = reference(tok, BATCH)
    assert expected == tok.encode_texts(pa.array(BATCH)).to_pylist()  # the batch call agrees
    with Encoder(tok, CacheSettings(root)) as cold:
        assert encode(cold, BATCH) == expected
    assert (cold.stats.from_cache, cold.stats.tokenized) == (0, DISTINCT)
    segs = segment_files(root)
    assert len(segs) == 1
    assert segs[0].stem == hashlib.sha256(segs[0].read_bytes()).hexdigest()
    assert read_segment(segs[0]).num_rows == DISTINCT
    assert not list(root.rglob(".tmp-*"))
    assert (root / fo.MARKER).is_file()

    with Encoder(tok, CacheSettings(root)) as warm:
        assert encode(warm, BATCH) == expected
        assert encode(warm, BATCH[::-1]) == expected[::-1]
    s = warm.stats
    assert (s.strings, s.distinct, s.from_cache) == (2 * len(BATCH), 2 * DISTINCT, 2 * DISTINCT)
    assert s.tokenized == s.tokens_tokenized == 0
    assert s.tokens_from_cache == 2 * sum(len(r) for r in reference(tok, list(dict.fromkeys(BATCH))))
    summary = warm.summary()
    assert summary is not None
    assert summary["hit_rate"] == 1.0 and summary["segments_written"] == 0 and summary["segments_damaged"] == 0
    assert segment_files(root) == segs  # nothing new written


def test_namespace_is_the_tokenizer_key(tok: HFTokenizer, tmp_path: Path) -> None:
    """Ids live under sha256(cache_key)[:32] with key.json holding the key; another tokenizer file
    gets its own namespace and never reads the first one's ids."""
    root = tmp_path / "cache"
    with Encoder(tok, CacheSettings(root)) as enc:
        encode(enc, BATCH)
    space = root / hashlib.sha256(tok.cache_key.encode()).hexdigest()[:32]
    assert (space / "key.json").read_text() == tok.cache_key
    assert json.loads(tok.cache_key)["tokenizer_sha256"] == hashlib.sha256(Path(tok.path).read_bytes()).hexdigest()
    assert segment_files(root) == segment_files(space)

    other = HFTokenizer(train_tokenizer(tmp_path / "other" / "tokenizer.json", vocab_size=300))
    assert other.cache_key != tok.cache_key
    assert reference(other, BATCH) != reference(tok, BATCH)  # were its ids read, they would be wrong
    with Encoder(other, CacheSettings(root)) as enc:
        assert encode(enc, BATCH) == reference(other, BATCH)
    assert enc.stats.from_cache == 0 and enc.stats.tokenized == DISTINCT
    assert len(fo.namespaces(root)) == 2


def test_repeats_across_batches_of_one_run(tok: HFTokenizer, tmp_path: Path) -> None:
    """A text tokenized in an earlier batch of the same run is found again before anything is written."""
    with Encoder(tok, CacheSettings(tmp_path / "cache")) as enc:
        encode(enc, BATCH)
        assert encode(enc, ["x", SYSTEM, "new text"]) == reference(tok, ["x", SYSTEM, "new text"])
        assert (enc.stats.from_cache, enc.stats.tokenized) == (2, DISTINCT + 1)
        assert segment_files(tmp_path / "cache") == []  # still pending: written at close
    assert len(segment_files(tmp_path / "cache")) == 1


def test_many_segments_and_small_memory(tok: HFTokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With tiny flush and memory limits (a segment every few texts, segments dropped from memory
    and read back from disk), cold and warm ids still equal the tokenizer's on random batches."""
    monkeypatch.setattr(store_module, "FLUSH_IDS", 10)
    monkeypatch.setattr(store_module, "LOADED_IDS", 10)
    rng = random.Random(7)
    words = ["hello", "the", "数据", "<|im_end|>", "", "test", "café", "\n"]
    batches = [[" ".join(rng.choices(words, k=rng.randint(0, 4))) for _ in range(25)] for _ in range(8)]
    root = tmp_path / "cache"
    with Encoder(tok, CacheSettings(root)) as cold:
        for b in batches:
            assert encode(cold, b) == reference(tok, b)
    assert cold.store is not None and cold.store.written > 1
    assert len(segment_files(root)) == cold.store.written
    with Encoder(tok, CacheSettings(root)) as warm:
        for b in batches[::-1]:
            assert encode(warm, b) == reference(tok, b)
    assert warm.stats.tokenized == 0 and warm.stats.from_cache == warm.stats.distinct


def damaged_cache(tok: HFTokenizer, root: Path) -> Path:
    """A cache of BATCH whose one segment has 16 bytes flipped in its middle; the segment's path."""
    with Encoder(tok, CacheSettings(root)) as enc:
        encode(enc, BATCH + [f"filler text {i} " * 5 for i in range(60)])
    (seg,) = segment_files(root)
    flip_middle(seg)
    return seg


def damage_warned(caught: list[warnings.WarningMessage]) -> bool:
    """One EtlWarning about a damaged segment was given."""
    return sum(issubclass(w.category, EtlWarning) and "damaged" in str(w.message) for w in caught) == 1


def test_damaged_segment_is_dropped_and_rewritten(tok: HFTokenizer, tmp_path: Path) -> None:
    """A segment damaged on disk: an EtlWarning, ids still the tokenizer's, the damaged file gone,
    and a new valid segment (name == sha256 of its bytes) written in its place."""
    root = tmp_path / "cache"
    seg = damaged_cache(tok, root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Encoder(tok, CacheSettings(root)) as enc:
            assert encode(enc, BATCH) == reference(tok, BATCH)
    assert damage_warned(caught)
    assert not seg.exists()
    summary = enc.summary()
    assert summary is not None and summary["segments_damaged"] == 1 and summary["segments_written"] == 1
    (new,) = segment_files(root)
    assert new.stem == hashlib.sha256(new.read_bytes()).hexdigest()
    assert read_segment(new).num_rows == DISTINCT
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new segment is fine: no warning now
        with Encoder(tok, CacheSettings(root)) as warm:
            assert encode(warm, BATCH) == reference(tok, BATCH)
    assert warm.stats.tokenized == 0


def test_after_a_damaged_segment_later_batches_reuse_this_runs_ids(tok: HFTokenizer, tmp_path: Path) -> None:
    """After a damaged segment's texts were tokenized again, a later batch of the same run finds
    them among this run's ids (as any other text tokenized earlier in the run): they are not
    tokenized once per batch, and the segment written holds each text once."""
    root = tmp_path / "cache"
    damaged_cache(tok, root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Encoder(tok, CacheSettings(root)) as enc:
            assert encode(enc, BATCH) == reference(tok, BATCH)
            first = enc.stats.tokenized
            assert encode(enc, BATCH) == reference(tok, BATCH)
            assert enc.stats.tokenized == first, "the second batch tokenized texts this run already had"
    assert damage_warned(caught)
    (new,) = segment_files(root)
    table = read_segment(new)
    keys = set(zip(table[KEY0].to_pylist(), table[KEY1].to_pylist(), strict=True))
    assert len(keys) == table.num_rows, "the new segment holds some texts twice"


def test_vanished_segment_is_tokenized_again(tok: HFTokenizer, tmp_path: Path) -> None:
    """A segment removed after the run opened the cache (another run evicted it): no warning, the
    tokenizer's ids, and the texts written again."""
    root = tmp_path / "cache"
    with Encoder(tok, CacheSettings(root)) as enc:
        encode(enc, BATCH)
    (seg,) = segment_files(root)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Encoder(tok, CacheSettings(root)) as enc:
            assert enc.store is not None and len(enc.store.base.k0) == DISTINCT  # index read: seg known
            seg.unlink()
            assert encode(enc, BATCH) == reference(tok, BATCH)
    assert enc.stats.tokenized == DISTINCT
    assert len(segment_files(root)) == 1


def test_warm_read_marks_the_segment_recently_used(tok: HFTokenizer, tmp_path: Path) -> None:
    """Reading a segment sets its mtime to now (eviction goes by mtime, oldest first)."""
    import os
    import time

    root = tmp_path / "cache"
    with Encoder(tok, CacheSettings(root)) as enc:
        encode(enc, BATCH)
    (seg,) = segment_files(root)
    old = time.time() - 10_000
    os.utime(seg, (old, old))
    with Encoder(tok, CacheSettings(root)) as enc:
        encode(enc, ["hello world"])
    assert seg.stat().st_mtime > old + 9_000


def test_bytes_tokenizer_uses_no_cache(tmp_path: Path) -> None:
    """The built-in bytes tokenizer has no cache key: no cache folder is made, no summary, and its
    ids are its own (the UTF-8 bytes)."""
    root = tmp_path / "cache"
    tok = ByteTokenizer()
    with Encoder(tok, CacheSettings(root)) as enc:
        got = encode(enc, BATCH)
    assert got == tok.encode_texts(pa.array(BATCH)).to_pylist()
    assert got[5] == list("数据 模型 café".encode())
    assert enc.summary() is None
    assert not root.exists()


def test_close_is_once_and_logs_the_run(tok: HFTokenizer, tmp_path: Path) -> None:
    """close writes one line to runs.jsonl with the run's counts; closing again adds nothing."""
    root = tmp_path / "cache"
    enc = Encoder(tok, CacheSettings(root))
    encode(enc, BATCH)
    enc.close()
    before = all_files(root)
    enc.close()
    assert all_files(root) == before
    (line,) = (root / "runs.jsonl").read_text().splitlines()
    entry = json.loads(line)
    assert (entry["strings"], entry["distinct"]) == (len(BATCH), DISTINCT)
    assert (entry["tokenized"], entry["from_cache"]) == (DISTINCT, 0)
    assert entry["namespace"] == hashlib.sha256(tok.cache_key.encode()).hexdigest()[:32]


def test_the_saving_is_priced_at_the_rate_of_the_backend_the_run_uses(tiny_tokenizer_path: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm run that tokenized nothing prices its cached tokens at the last logged rate of its own
    backend, never at another's (gigatoken's ~40x `tokenizers`' would overstate or hide it)."""
    root = tmp_path / "cache"
    tok = HFTokenizer(tiny_tokenizer_path)
    tok.plan(0)  # a small input: `auto` settles on hf
    cold = Encoder(tok, CacheSettings(root))
    encode(cold, BATCH)
    cold.close()
    entry = json.loads((root / "runs.jsonl").read_text().splitlines()[-1])
    assert entry["backend"] == "hf"
    fo.log_run(root, {**entry, "tokens_tokenized": 1000, "tokenizer_seconds": 1.0})  # hf: 1,000 tokens/s
    fo.log_run(root, {**entry, "backend": "gigatoken", "tokens_tokenized": 40000, "tokenizer_seconds": 1.0})
    warm = Encoder(HFTokenizer(tiny_tokenizer_path), CacheSettings(root))
    warm.tokenizer.plan(0)
    encode(warm, BATCH)
    cached = warm.stats.tokens_from_cache
    assert cached > 0 and warm.stats.tokenized == 0
    assert warm.saving()[SAVED] == pytest.approx(cached / 1000)
    monkeypatch.setattr(warm, "_backend", lambda: "gigatoken")
    assert warm.saving()[SAVED] == pytest.approx(cached / 40000)
    monkeypatch.setattr(warm, "_backend", lambda: "other")  # no run of it logged: no estimate
    assert warm.saving() == {}


@pytest.mark.shared
@pytest.mark.skipif(not QWEN.is_dir(), reason="../shared/data is absent")
def test_qwen_long_texts_cold_and_warm(tmp_path: Path) -> None:
    """Qwen2.5 (from ../shared): texts past the piece size (encoded in cuts), specials-as-text and
    repeats come back from the cache as the tokenizer encodes them."""
    tok = HFTokenizer(QWEN)
    rng = np.random.default_rng(3)
    long = " ".join(rng.choice(["alpha", "beta", "数据", "\n\n", "def f(x):", "<|im_end|>"], 30_000).tolist())
    texts = [long, "short", long, "<tool_call>{}</tool_call>", "", "short"]
    expected = tok.encode_texts(pa.array(texts)).to_pylist()
    root = tmp_path / "cache"
    for _ in range(2):
        with Encoder(tok, CacheSettings(root)) as enc:
            assert encode(enc, texts) == expected
    assert enc.stats.tokenized == 0 and enc.stats.from_cache == 4


PIECES = ["a", "the ", "数", "é", " ", "\n", "<|im_end|>", "<|im_start|>", "x"]
TEXTS = st.lists(st.sampled_from(PIECES), max_size=6).map("".join)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(TEXTS, max_size=12), min_size=1, max_size=4), flush=st.sampled_from([1, 8, 1 << 20]))
def test_any_batches_cold_and_warm(tok: HFTokenizer, batches: list[list[str]], flush: int) -> None:
    """Any batches of short texts (repeats, empties, specials as text), segments flushed after every
    few ids or once: each text's ids equal the tokenizer's own, in a cold run and in a warm one,
    and the warm one tokenizes nothing."""
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(store_module, "FLUSH_IDS", flush):
        root = Path(tmp) / "cache"
        for _ in range(2):
            with Encoder(tok, CacheSettings(root)) as enc:
                for b in batches:
                    assert encode(enc, b) == reference(tok, b)
        assert enc.stats.tokenized == 0 and enc.stats.from_cache == enc.stats.distinct
