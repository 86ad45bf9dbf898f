"""The per-run check of gigatoken against `tokenizers` (`ContentBackend`), the second line behind
the allow-list: it samples every encode of the run, not only the first texts; a difference before
any unchecked gigatoken id falls back to `tokenizers` with one line and leaves nothing behind; a
later one stops the run with one line (ids already written may differ)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from etl.cli import main
from etl.errors import EtlError, EtlWarning
from etl.tokens import backend
from etl.tokens import gigatoken_encoder as fast
from etl.tokens.hf_tokenizer import HFTokenizer
from tests.cache.common import chats, train_tokenizer, write_jsonl

pytest.importorskip("gigatoken")
POISON = "POISON"


def wrong_on(marker: str) -> Any:
    """gigatoken's encode, one id off in every text that holds `marker` ("": every text)."""
    real = fast.encode

    def encode(tok: Any, texts: pa.LargeStringArray) -> tuple[np.ndarray, np.ndarray]:
        flat, lengths = real(tok, texts)
        flat, ends = flat.copy(), np.cumsum(lengths)
        for i, text in enumerate(texts.to_pylist()):
            if marker in text and lengths[i]:
                flat[ends[i] - 1] += 1
        return flat, lengths
    return encode


@pytest.fixture
def tok(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HFTokenizer:
    monkeypatch.setattr(backend, "VERIFY_TEXTS", 20)  # a small first stretch, then the share
    monkeypatch.setattr(backend, "VERIFY_BYTES", 1 << 20)
    monkeypatch.setattr(backend, "VERIFY_SHARE", 1 / 50)
    return HFTokenizer(train_tokenizer(tmp_path / "tokenizer.json"), backend="auto")


def batch(i: int, n: int = 500, marker: str = "") -> pa.Array:
    return pa.array([f"text {i}.{k} {marker} the of and" for k in range(n)])


def test_every_encode_is_sampled_after_the_first_texts(tok: HFTokenizer) -> None:
    tok.encode_texts(batch(0, 20))
    assert tok.content._checked[0] == 20 and not tok.content._unchecked  # the first stretch: every text
    for i in range(1, 4):
        tok.encode_texts(batch(i))
        assert tok.content._checked[0] == 20 + 10 * i  # 500 texts / 50, spread over the call
    assert tok.content._unchecked and tok.backend_used == fast.GIGATOKEN


def test_a_difference_late_in_the_run_stops_it(tok: HFTokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast, "encode", wrong_on(POISON))
    for i in range(3):
        tok.encode_texts(batch(i))
    with pytest.raises(EtlError, match="after it encoded texts the check did not see; pass --tokenizer-backend hf$"):
        tok.encode_texts(batch(3, marker=POISON))


def test_a_difference_in_the_first_texts_falls_back(tok: HFTokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast, "encode", wrong_on(POISON))
    with pytest.warns(EtlWarning, match="this run encodes with tokenizers"):
        tok.encode_texts(batch(0, 20, marker=POISON))
    assert tok.backend_used == fast.HF and POISON in (tok.content.reason or "")
    assert tok.content.served() == [backend.TOKENIZERS_IDS]  # gigatoken's cached ids no longer served


def run_forced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
               *flags: str) -> tuple[int, list[str]]:
    monkeypatch.setattr(backend, "AUTO_MIN_BYTES", 0)
    monkeypatch.setattr(fast, "encode", wrong_on(""))
    path = train_tokenizer(tmp_path / "tok" / "tokenizer.json")
    src = write_jsonl(tmp_path / "chats.jsonl", chats(30))
    capsys.readouterr()
    rc = main(["run", str(src), str(tmp_path / "out"), "--tokenizer", str(path), "--template", "chatml",
               "--no-cache", "--quiet", *flags])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines() + captured.out.strip().splitlines()
    return rc, [line for line in lines if "spell a control token" not in line]  # `chats` spell <|im_end|>


def test_a_forced_mismatch_falls_back_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    rc, lines = run_forced(tmp_path, monkeypatch, capsys)
    assert rc == 0 and len(lines) == 1 and "falls back" not in lines[0] and "encodes with tokenizers" in lines[0], lines
    assert not (tmp_path / "out" / "_journal.jsonl").exists()
    import json

    cache = json.loads((tmp_path / "out" / "_manifest.json").read_text())["token_cache"]
    assert cache["backend"] == "hf" and "other ids" in cache["backend_reason"]


def test_a_forced_mismatch_with_gigatoken_asked_for_stops_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rc, lines = run_forced(tmp_path, monkeypatch, capsys, "--tokenizer-backend", "gigatoken")
    assert rc == 2 and len(lines) == 1 and "gives other ids" in lines[0], lines  # no Polars trailer
    assert not (tmp_path / "out").exists()  # no empty journal, no empty folder
