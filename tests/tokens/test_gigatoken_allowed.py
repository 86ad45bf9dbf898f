"""gigatoken only where equal by construction (`etl.tokens.gigatoken_allowed`): every `ALLOWED`
entry gives `tokenizers`' ids on hypothesis texts (random unicode, whitespace, digits,
punctuation) with a vocabulary trained here, and on real texts with the real vocabularies of
../shared/data (skipped when absent); options gigatoken reads differently are refused, `auto` then
encodes with `tokenizers` and says why in the manifest, and `gigatoken` by name is an error."""

from __future__ import annotations

import copy
import functools
import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.cli import main
from etl.tokens import backend
from etl.tokens import gigatoken_allowed as allowed
from etl.tokens import gigatoken_encoder as fast
from etl.tokens.hf_tokenizer import HFTokenizer
from tests.cache.common import SPECIALS, SYSTEM, chats, etl_run, write_jsonl

pytest.importorskip("gigatoken")
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="needs ../shared/data")
CORPUS = ["Hello world, it's a test.\nLine two: 123 4567 数据 模型 café\n\n" * 3, "the of and to in is " * 5,
          SYSTEM, "don't ... a.b (x) [y] {z} 1,234.56 -- 'quoted' \"double\" \t tab   spaces"]
SPACE = "\u2581"


def trained(entry: str) -> dict[str, Any]:
    """A tokenizer.json with `entry`'s components and a BPE vocabulary trained here (no download)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if entry == "sentencepiece_bpe":
        tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
        tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
        tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", *SPECIALS]))
        spec = json.loads(tok.to_str())
        vocab = spec["model"]["vocab"]
        for b in range(256):  # byte fallback needs every byte as a token of the vocabulary
            vocab.setdefault(f"<0x{b:02X}>", len(vocab))
        return spec
    tok = Tokenizer(models.BPE(ignore_merges=entry == "llama3"))
    split = {"qwen2": allowed.QWEN2, "llama3": allowed.LLAMA3}.get(entry)
    tok.pre_tokenizer = (pre_tokenizers.ByteLevel(add_prefix_space=False) if split is None else pre_tokenizers.Sequence(
        [pre_tokenizers.Split(__import__("tokenizers").Regex(split), "isolated"),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))
    tok.normalizer = normalizers.NFC() if entry == "qwen2" else None
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=SPECIALS))
    return json.loads(tok.to_str())


@functools.cache
def pair(text: str) -> tuple[Any, Any]:
    """(gigatoken's tokenizer, `tokenizers`' with etl's content rule) of a tokenizer.json's text."""
    from tokenizers import Tokenizer

    reference = Tokenizer.from_str(text)
    reference.encode_special_tokens = True
    return fast.load(text.encode(), "test"), reference


def differing(spec: dict[str, Any], texts: list[str]) -> list[str]:
    """The texts whose ids gigatoken and `tokenizers` give differently (late-Unicode texts aside:
    etl sends them to `tokenizers`, `fast.needs_reference`)."""
    giga, reference = pair(json.dumps(spec))
    arr = pa.array(texts, pa.large_string())
    arr = arr.take(np.setdiff1d(np.arange(len(arr)), fast.needs_reference(arr)))
    flat, lengths = fast.encode(giga, arr)
    ends = np.cumsum(lengths)
    want = reference.encode_batch(arr.to_pylist(), add_special_tokens=False)
    return [t for t, e, n, w in zip(arr.to_pylist(), ends, lengths, want, strict=True) if flat[e - n:e].tolist() != w.ids]


PIECES = [" ", "  ", "\n", "\n\n", "\t", "\r\n", " \n ", "\u00a0", "\u3000", "0", "123", "4567890", "1,234.5",
          "'s", "'LL", "don't", "...", "!?", "a.b", "(x)", "--", "数据", "😀", "é", "e\u0301", "ﬁ", "Ａ", "Hello", " world"]
TEXTS = st.lists(st.one_of(st.text(st.characters(blacklist_categories=("Cs",)), max_size=10), st.sampled_from(PIECES)),
                 max_size=14).map("".join)


@pytest.mark.parametrize("entry", list(allowed.ALLOWED))
@settings(max_examples=30, deadline=None)
@given(texts=st.lists(TEXTS, min_size=1, max_size=16))
def test_every_allowed_entry_gives_tokenizers_ids(entry: str, texts: list[str]) -> None:
    spec = trained_spec(entry)
    assert allowed.refusal(allowed.components(json.dumps(spec).encode())) is None
    assert differing(spec, texts) == []


@functools.cache
def _trained_text(entry: str) -> str:
    return json.dumps(trained(entry))


def trained_spec(entry: str) -> dict[str, Any]:
    return json.loads(_trained_text(entry))


@functools.cache
def real_texts() -> list[str]:
    """T0's first 1,500 records' strings and hh-rlhf's first 300 dialogues."""
    out = []
    with gzip.open(SHARED / "t0-train-50k/t0_train_50k_per_template.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in itertools.islice(f, 1500):
            out += [v for v in json.loads(line).values() if isinstance(v, str)]
    with gzip.open(SHARED / "hh-rlhf/harmless-base-test.jsonl.gz", "rt", encoding="utf-8") as f:
        out += [json.loads(line)["chosen"] for line in itertools.islice(f, 300)]
    return out


def shared_spec(name: str) -> dict[str, Any]:
    return json.loads((SHARED / name / "tokenizer.json").read_text(encoding="utf-8"))


def _llama3_style(spec: dict[str, Any]) -> None:
    spec["normalizer"] = None
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = allowed.LLAMA3
    spec["pre_tokenizer"]["pretokenizers"][1]["trim_offsets"] = True
    spec["model"]["ignore_merges"] = True


def _gpt2_style(spec: dict[str, Any]) -> None:
    spec["normalizer"] = None
    spec["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


REAL = {  # name -> (../shared tokenizer, change to its file, the ALLOWED entry that accepts it)
    "qwen2.5": ("qwen2.5-tokenizer", None, "qwen2"), "qwen3": ("qwen3-tokenizer", None, "qwen2"),
    "phi3": ("phi3-tokenizer", None, "sentencepiece_bpe"),
    "llama3-style": ("qwen2.5-tokenizer", _llama3_style, "llama3"), "gpt2-style": ("qwen2.5-tokenizer", _gpt2_style, "gpt2"),
}


@needs_shared
@pytest.mark.parametrize("name", list(REAL))
def test_real_vocabularies_give_tokenizers_ids_on_real_texts(name: str) -> None:
    folder, change, _ = REAL[name]
    spec = shared_spec(folder)
    if change is not None:
        change(spec)
    assert allowed.refusal(allowed.components(json.dumps(spec).encode())) is None
    rng = np.random.default_rng(0)
    mixed = ["".join(rng.choice(PIECES, size=12)) for _ in range(500)]
    assert differing(spec, real_texts() + mixed) == []


def _set(path: str, value: Any) -> Any:
    def change(spec: dict[str, Any]) -> None:
        *steps, last = path.split(".")
        at = spec
        for step in steps:
            at = at[int(step)] if step.isdigit() else at[step]
        at[last] = value
    return change


REFUSED = {  # name -> (change, the component the refusal names): gigatoken 0.10 reads each differently
    "add_prefix_space": (_set("pre_tokenizer.pretokenizers.1.add_prefix_space", True), "pre_tokenizer"),
    "use_regex": (_set("pre_tokenizer.pretokenizers.1.use_regex", True), "pre_tokenizer"),
    "removed": (_set("pre_tokenizer.pretokenizers.0.behavior", "Removed"), "pre_tokenizer"),
    "dropout": (_set("model.dropout", 0.5), "model"),
    "lowercase": (_set("normalizer", {"type": "Lowercase"}), "normalizer"),
    "truncation": (_set("truncation", {"direction": "Right", "max_length": 8, "strategy": "LongestFirst",
                                       "stride": 0}), "truncation"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_options_read_differently_are_refused(name: str) -> None:
    change, component = REFUSED[name]
    spec = trained_spec("qwen2")
    change(spec)
    assert component in (allowed.refusal(allowed.components(json.dumps(spec).encode())) or "")


@needs_shared
def test_the_refused_options_do_give_other_ids_with_qwen25() -> None:
    """Why the list exists: each of these loads in gigatoken and gives other ids than tokenizers."""
    for name in ("add_prefix_space", "use_regex", "removed"):
        spec = shared_spec("qwen2.5-tokenizer")
        REFUSED[name][0](spec)
        assert differing(spec, real_texts()[:300]), name


def prefix_space_tokenizer(tmp_path: Path) -> Path:
    """Qwen2.5's tokenizer with `add_prefix_space: true` where ../shared exists, else the trained one's."""
    spec = shared_spec("qwen2.5-tokenizer") if SHARED.is_dir() else trained_spec("qwen2")
    REFUSED["add_prefix_space"][0](spec)
    if not SHARED.is_dir():
        spec["added_tokens"] = [{"id": spec["model"]["vocab"][t], "content": t, "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": True} for t in SPECIALS]
    path = tmp_path / "tok" / "tokenizer.json"
    path.parent.mkdir()
    path.write_text(json.dumps(spec), encoding="utf-8")
    return path


def test_auto_uses_tokenizers_for_a_refused_tokenizer_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from tokenizers import Tokenizer

    monkeypatch.setattr(backend, "AUTO_MIN_BYTES", 0)  # auto would take gigatoken whatever the input's size
    path = prefix_space_tokenizer(tmp_path)
    src = write_jsonl(tmp_path / "chats.jsonl", chats(20))
    flags = ["--tokenizer", str(path), "--template", "chatml", "--no-cache"]
    manifest = etl_run(src, tmp_path / "auto", *flags)
    assert manifest["token_cache"]["backend"] == "hf"
    assert "add_prefix_space" in manifest["token_cache"]["backend_reason"]
    tok = HFTokenizer(path, backend="auto")
    tok.plan(backend.AUTO_MIN_BYTES)
    texts = ["Hello, world! 123 4567", "  it's (a) test.", "数据 模型"]
    reference = Tokenizer.from_file(str(path))
    reference.encode_special_tokens = True
    assert tok.encode_texts(pa.array(texts)).to_pylist() == [e.ids for e in reference.encode_batch(
        texts, add_special_tokens=False)]
    assert tok.backend_used == "hf"
    capsys.readouterr()
    assert main(["run", str(src), str(tmp_path / "forced"), *flags, "--quiet", "--tokenizer-backend", "gigatoken"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "may not encode" in err[0] and "add_prefix_space" in err[0], err
    assert "--tokenizer-backend auto" in err[0] and not (tmp_path / "forced").exists()


def test_small_and_explicit_hf_runs_say_why_too(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "chats.jsonl", chats(5))
    path = tmp_path / "tok.json"
    path.write_text(_trained_text("gpt2"), encoding="utf-8")
    flags = ["--tokenizer", str(path), "--template", "chatml", "--no-cache"]
    assert etl_run(src, tmp_path / "auto", *flags)["token_cache"]["backend_reason"] == "auto: input under 4 MiB"
    hf = etl_run(src, tmp_path / "hf", *flags, "--tokenizer-backend", "hf")["token_cache"]
    assert hf["backend"] == "hf" and "hf" in hf["backend_reason"]


def test_a_sequence_of_other_length_or_order_is_refused() -> None:
    spec = trained_spec("qwen2")
    steps = spec["pre_tokenizer"]["pretokenizers"]
    for changed in (steps[::-1], steps[:1], [*steps, steps[1]]):
        other = copy.deepcopy(spec)
        other["pre_tokenizer"]["pretokenizers"] = changed
        assert allowed.refusal(allowed.components(json.dumps(other).encode())) is not None
