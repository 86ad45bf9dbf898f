"""The token cache keeps each encoder's ids apart (`etl.cache.keys.tagged`): ids gigatoken made are
served only to runs that accept gigatoken, never to a `--tokenizer-backend hf` run; `tokenizers`'
ids (the reference) are served to any run; a cache from before encoders were named is not read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from etl.tokens import backend
from etl.tokens import gigatoken_encoder as fast
from etl.tokens.hf_tokenizer import CONTENT_ENCODING, HFTokenizer
from tests.cache.common import chats, etl_run, output_digests, train_tokenizer, write_jsonl

pytest.importorskip("gigatoken")


def wrong_ids(real: Any) -> Any:
    def encode(tok: Any, texts: pa.LargeStringArray) -> tuple[np.ndarray, np.ndarray]:
        flat, lengths = real(tok, texts)
        return flat + 1, lengths  # every id off by one
    return encode


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[str]]:
    monkeypatch.setattr(backend, "AUTO_MIN_BYTES", 0)
    src = write_jsonl(tmp_path / "chats.jsonl", chats(40))
    flags = ["--tokenizer", str(train_tokenizer(tmp_path / "tok" / "tokenizer.json")), "--template", "chatml"]
    etl_run(src, tmp_path / "plain", *flags, "--no-cache", "--tokenizer-backend", "hf")
    return src, flags


def test_ids_gigatoken_cached_are_not_served_to_an_hf_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          setup: tuple[Path, list[str]]) -> None:
    """The attack: gigatoken's wrong ids, missed by the check, cached; an hf run must not read them."""
    src, flags = setup
    cache = ["--cache", str(tmp_path / "cache")]
    with monkeypatch.context() as m:
        m.setattr(fast, "encode", wrong_ids(fast.encode))
        m.setattr(backend.ContentBackend, "_verify", lambda *a: None)  # a difference the check missed
        poisoned = etl_run(src, tmp_path / "poisoned", *flags, *cache)
    assert poisoned["token_cache"]["backend"] == "gigatoken"
    assert output_digests(tmp_path / "poisoned") != output_digests(tmp_path / "plain")
    hf = etl_run(src, tmp_path / "hf", *flags, *cache, "--tokenizer-backend", "hf")
    assert hf["token_cache"]["from_cache"] == 0 and hf["token_cache"]["backend"] == "hf"
    assert output_digests(tmp_path / "hf") == output_digests(tmp_path / "plain")


def test_tokenizers_ids_are_served_to_every_run(tmp_path: Path, setup: tuple[Path, list[str]]) -> None:
    src, flags = setup
    cache = ["--cache", str(tmp_path / "cache")]
    etl_run(src, tmp_path / "hf", *flags, *cache, "--tokenizer-backend", "hf")
    auto = etl_run(src, tmp_path / "auto", *flags, *cache)["token_cache"]
    assert auto["tokenized"] == 0 and auto["from_cache"] == auto["distinct"] > 0
    assert output_digests(tmp_path / "auto") == output_digests(tmp_path / "plain")
    again = etl_run(src, tmp_path / "again", *flags, *cache, "--tokenizer-backend", "gigatoken")["token_cache"]
    assert again["tokenized"] == 0


def test_gigatoken_ids_are_served_to_gigatoken_runs(tmp_path: Path, setup: tuple[Path, list[str]]) -> None:
    src, flags = setup
    cache = ["--cache", str(tmp_path / "cache")]
    assert etl_run(src, tmp_path / "cold", *flags, *cache)["token_cache"]["backend"] == "gigatoken"
    warm = etl_run(src, tmp_path / "warm", *flags, *cache)["token_cache"]
    assert warm["tokenized"] == 0 and output_digests(tmp_path / "warm") == output_digests(tmp_path / "plain")


def test_a_cache_from_before_encoders_were_named_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             setup: tuple[Path, list[str]]) -> None:
    """Such a cache may hold gigatoken's ids of a tokenizer it reads otherwise, under tokenizers' keys."""
    import tokenizers

    src, flags = setup
    cache = ["--cache", str(tmp_path / "cache")]

    def old_key(self: HFTokenizer) -> str:  # the key before this change: no "encoder"
        return json.dumps({"tokenizer_sha256": self.sha256, "tokenizers": tokenizers.__version__,
                           "content": CONTENT_ENCODING}, sort_keys=True)

    with monkeypatch.context() as m:
        m.setattr(HFTokenizer, "cache_key", property(old_key))
        m.setattr(fast, "encode", wrong_ids(fast.encode))
        m.setattr(backend.ContentBackend, "_verify", lambda *a: None)
        m.setattr(backend.ContentBackend, "made", property(lambda self: backend.TOKENIZERS_IDS))  # the old keys
        etl_run(src, tmp_path / "old", *flags, *cache)
    hf = etl_run(src, tmp_path / "hf", *flags, *cache, "--tokenizer-backend", "hf")
    assert hf["token_cache"]["from_cache"] == 0
    assert output_digests(tmp_path / "hf") == output_digests(tmp_path / "plain")
