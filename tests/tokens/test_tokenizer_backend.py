"""`--tokenizer-backend`: gigatoken gives exactly the ids of `tokenizers` with etl's content rule
(every added token special, `encode_special_tokens`), and a run that cannot trust it uses `tokenizers`.

The reference is built here from `tokenizers` alone. Tokenizers: one trained here (always), the
three of ../shared/data (skipped when absent) and `bytes`. Text: hypothesis over every unicode
category, whitespace runs, digits, CJK, emoji and every added token's string, plus texts longer
than the piece size (`PIECE_BYTES`) that etl cuts before encoding.
"""

from __future__ import annotations

import functools
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from etl.errors import EtlError, EtlWarning
from etl.tokens import backend
from etl.tokens import gigatoken_encoder as fast
from etl.tokens.hf_pipeline import as_transformers
from etl.tokens.hf_tokenizer import PIECE_BYTES, HFTokenizer
from etl.tokens.loading import load_tokenizer
from tests.cache.common import chats, etl_run, output_digests, train_tokenizer, write_jsonl

pytest.importorskip("gigatoken")
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
REAL = ["qwen2.5-tokenizer", "qwen3-tokenizer", "phi3-tokenizer"]


@functools.cache
def local_tokenizer() -> Path:
    """A byte-level BPE trained here, with ChatML's specials and two non-special added tokens."""
    import tempfile

    from tokenizers import AddedToken, Tokenizer

    path = train_tokenizer(Path(tempfile.mkdtemp()) / "tokenizer.json")
    tok = Tokenizer.from_file(str(path))
    tok.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    tok.save(str(path))
    return path


def paths() -> list[Any]:
    real = [pytest.param(SHARED / n, id=n, marks=pytest.mark.skipif(not SHARED.is_dir(), reason="needs ../shared/data"))
            for n in REAL]
    return [pytest.param("local", id="local"), *real]


@functools.cache
def loaded(spec: str | Path) -> tuple[HFTokenizer, Any, list[str]]:
    """(etl's tokenizer, the reference `tokenizers.Tokenizer`, the added tokens' strings)."""
    from tokenizers import AddedToken, Tokenizer

    path = local_tokenizer() if spec == "local" else Path(spec) / "tokenizer.json"
    reference = Tokenizer.from_file(str(path))
    config = path.with_name("tokenizer_config.json")
    # The pipeline transformers builds for pieces (Phi-3's Metaspace: etl.tokens.hf_pipeline).
    as_transformers(reference, json.loads(config.read_text()) if config.is_file() else {})
    added = [t.content for t in reference.get_added_tokens_decoder().values()]
    reference.add_special_tokens([AddedToken(t.content, single_word=t.single_word, lstrip=t.lstrip, rstrip=t.rstrip,
                                             normalized=t.normalized, special=True)
                                  for t in reference.get_added_tokens_decoder().values() if not t.special])
    reference.encode_special_tokens = True
    return HFTokenizer(path, backend="auto"), reference, added


def expected(reference: Any, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in reference.encode_batch(texts, add_special_tokens=False)]


PIECES = [" ", "  ", "\n", "\n\n", "\t", "\r\n", "   \n ", "0", "123", "4567890", "数据", "模型训练", "😀", "👍🏽",
          "🇫🇷", "é", "e\u0301", "ﬁ", "Ａ", "'s", "'ll", "don't", "a.b", "...", "<|", "|>", "<", ">",
          "\U000323b0", "\U00016ea0", "\u0378"]  # the last three: letters of Unicode 17, unassigned in 14


def texts_with(added: list[str]) -> st.SearchStrategy[str]:
    """Texts built from random unicode and the pieces tokenizers split on, added tokens included."""
    piece = st.one_of(st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
                      st.sampled_from(PIECES + added))
    return st.lists(piece, max_size=16).map("".join)


@pytest.mark.parametrize("spec", paths())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_gigatoken_gives_tokenizers_ids(spec: Any, data: st.DataObject) -> None:
    tok, reference, added = loaded(spec)
    if tok.pipeline is not None:  # transformers rebuilds it (Phi-3: etl.tokens.hf_pipeline): gigatoken never encodes it
        assert tok.content.requested == "hf"
        return
    texts = data.draw(st.lists(texts_with(added), min_size=1, max_size=12))
    want = expected(reference, texts)
    arr = pa.array(texts, pa.large_string())
    plain = np.setdiff1d(np.arange(len(texts)), fast.needs_reference(arr))
    flat, lengths = fast.encode(tok.content.fast, arr.take(plain))
    ends = np.cumsum(lengths)
    assert [flat[e - n : e].tolist() for e, n in zip(ends, lengths, strict=True)] == [want[i] for i in plain]
    with warnings.catch_warnings():
        warnings.simplefilter("error", EtlWarning)  # auto must not have fallen back
        assert tok.encode_texts(pa.array(texts)).to_pylist() == want
    assert tok.backend_used == fast.GIGATOKEN


@pytest.mark.parametrize("spec", paths())
def test_long_texts_cut_into_pieces_keep_their_ids(spec: Any) -> None:
    tok, reference, added = loaded(spec)
    rng = np.random.default_rng(0)
    pieces = PIECES + added + ["word", " the", "Hello world, it's a test."]
    texts = ["".join(rng.choice(pieces, size=n)) for n in (30_000, 3, 60_000)]
    assert max(len(t.encode()) for t in texts) > 2 * PIECE_BYTES  # etl cuts these before encoding
    assert tok.encode_texts(pa.array(texts)).to_pylist() == expected(reference, texts)
    assert tok.backend_used == (fast.HF if tok.pipeline else fast.GIGATOKEN)


def test_texts_with_late_unicode_characters_go_to_tokenizers() -> None:
    texts = pa.array(["plain ascii", "数据 😀 café", "a\U000323b0/A", "", "\u0378", "x" * 5 + "\U0010ffff"],
                     pa.large_string())
    assert fast.needs_reference(texts).tolist() == [2, 4, 5]  # U+10FFFF: a noncharacter, unassigned
    assert fast.needs_reference(texts.slice(3)).tolist() == [1, 2]
    if SHARED.is_dir():  # gigatoken alone splits "/A" after U+323B0 otherwise than tokenizers
        tok, reference, _ = loaded(SHARED / "qwen2.5-tokenizer")
        assert fast.encode(tok.content.fast, texts.take([2]))[0].tolist() != expected(reference, ["a\U000323b0/A"])[0]
        assert tok.encode_texts(texts).to_pylist() == expected(reference, texts.to_pylist())


def test_the_unassigned_table_is_unicode_14s() -> None:
    import unicodedata

    if unicodedata.unidata_version != "14.0.0":
        pytest.skip(f"this Python's unicodedata is Unicode {unicodedata.unidata_version}")
    cps = np.arange(0x110000)
    at = np.searchsorted(fast._FIRST, cps, side="right") - 1
    listed = (at >= 0) & (cps <= fast._LAST[np.maximum(at, 0)])
    unassigned = np.array([unicodedata.category(chr(c)) == "Cn" for c in range(0x110000)])
    assert np.array_equal(listed, unassigned)


def test_merge_puts_each_subset_back_in_place() -> None:
    a = (np.array([1, 2, 3], np.int32), np.array([2, 1]))  # texts 0 and 2
    b = (np.array([7], np.int32), np.array([0, 1]))  # texts 1 and 3
    flat, lengths = fast.merge(4, [(np.array([0, 2]), a), (np.array([1, 3]), b)])
    assert flat.tolist() == [1, 2, 3, 7] and lengths.tolist() == [2, 0, 1, 1]


def test_bytes_tokenizer_encodes_utf8_bytes() -> None:
    texts = ["a <|im_end|> b", "数据 😀", ""]
    got = load_tokenizer("bytes", backend="gigatoken").encode_texts(pa.array(texts)).to_pylist()
    assert got == [list(t.encode()) for t in texts]


def test_first_difference_finds_the_first_text_that_differs() -> None:
    same = (np.array([1, 2, 3, 4], np.int32), np.array([2, 0, 2]))
    assert fast.first_difference(same, same) is None
    other_id = (np.array([1, 2, 3, 5], np.int32), np.array([2, 0, 2]))
    assert fast.first_difference(same, other_id) == 2
    other_cut = (np.array([1, 2, 3, 4], np.int32), np.array([1, 1, 2]))
    assert fast.first_difference(same, other_cut) == 0
    shorter = (np.array([1, 2, 3], np.int32), np.array([2, 0, 1]))
    assert fast.first_difference(same, shorter) == 2


def test_sample_spreads_over_the_texts() -> None:
    assert fast.sample(5, 10).tolist() == [0, 1, 2, 3, 4]
    assert fast.sample(101, 3).tolist() == [0, 50, 100]


def one_wrong_id(real: Any) -> Any:
    """gigatoken's encode with the last id of the last text changed: a backend that is wrong once."""
    def encode(tok: Any, texts: pa.LargeStringArray) -> tuple[np.ndarray, np.ndarray]:
        flat, lengths = real(tok, texts)
        flat = flat.copy()
        flat[-1] += 1
        return flat, lengths
    return encode


def test_auto_falls_back_to_tokenizers_on_a_wrong_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast, "encode", one_wrong_id(fast.encode))
    path = local_tokenizer()
    tok = HFTokenizer(path, backend="auto")
    texts = ["Hello world", "it's a test"]
    with pytest.warns(EtlWarning, match="gigatoken gives other ids than tokenizers for \"it's a test\""):
        got = tok.encode_texts(pa.array(texts)).to_pylist()
    assert got == expected(loaded("local")[1], texts)
    assert tok.backend_used == fast.HF
    assert tok.encode_texts(pa.array(["a second batch"])).to_pylist() == expected(loaded("local")[1], ["a second batch"])
    with pytest.raises(EtlError, match="--tokenizer-backend hf"):
        HFTokenizer(path, backend="gigatoken").encode_texts(pa.array(texts))


def test_a_run_is_the_same_with_every_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend, "AUTO_MIN_BYTES", 0)  # auto: gigatoken whatever the input's size
    src = write_jsonl(tmp_path / "chats.jsonl", chats(60))
    flags = ["--tokenizer", str(local_tokenizer()), "--template", "chatml", "--no-cache"]
    manifests = {b: etl_run(src, tmp_path / b, *flags, "--tokenizer-backend", b) for b in ("hf", "auto", "gigatoken")}
    assert output_digests(tmp_path / "hf") == output_digests(tmp_path / "auto") == output_digests(tmp_path / "gigatoken")
    assert {b: m["token_cache"]["backend"] for b, m in manifests.items()} == {
        "hf": "hf", "auto": "gigatoken", "gigatoken": "gigatoken"}
    assert len({m["run_id"] for m in manifests.values()}) == 1
    assert "tokenizer_backend" not in manifests["hf"]["config"]


def test_without_gigatoken_auto_uses_tokenizers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from etl.cli import main

    monkeypatch.setitem(sys.modules, "gigatoken", None)  # `import gigatoken` raises ImportError
    src = write_jsonl(tmp_path / "chats.jsonl", chats(5))
    flags = ["--tokenizer", str(local_tokenizer()), "--template", "chatml", "--no-cache", "--quiet"]
    manifest = etl_run(src, tmp_path / "auto", *flags[:-1])
    assert manifest["token_cache"]["backend"] == "hf"
    assert main(["run", str(src), str(tmp_path / "forced"), *flags, "--tokenizer-backend", "gigatoken"]) == 2
    assert "gigatoken is not installed" in capsys.readouterr().err
    assert not (tmp_path / "forced" / "_manifest.json").exists()


def test_auto_uses_tokenizers_for_a_small_input(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "chats.jsonl", chats(30))
    flags = ["--tokenizer", str(local_tokenizer()), "--template", "chatml", "--no-cache"]
    assert src.stat().st_size < backend.AUTO_MIN_BYTES
    assert etl_run(src, tmp_path / "auto", *flags)["token_cache"]["backend"] == "hf"
    big = HFTokenizer(local_tokenizer(), backend="auto")
    big.plan(backend.AUTO_MIN_BYTES)
    assert big.content.requested == "auto" and big.content._loading is not None and big.content.fast is not None


def test_a_run_of_cached_texts_names_no_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend, "AUTO_MIN_BYTES", 0)
    src = write_jsonl(tmp_path / "chats.jsonl", chats(3))
    flags = ["--tokenizer", str(local_tokenizer()), "--template", "chatml", "--cache", str(tmp_path / "cache")]
    assert etl_run(src, tmp_path / "cold", *flags)["token_cache"]["backend"] == "gigatoken"
    assert etl_run(src, tmp_path / "warm", *flags)["token_cache"]["backend"] is None


@pytest.mark.parametrize("layout", ["tokenizers", "reordered", "spaced"])
def test_without_added_tokens_empties_the_list_whatever_the_layout(layout: str) -> None:
    spec = json.loads(local_tokenizer().read_text(encoding="utf-8"))
    assert spec["added_tokens"]
    if layout == "reordered":  # another writer's key order: the whole file is parsed
        spec = {"model": spec["model"], "added_tokens": spec["added_tokens"],
                **{k: v for k, v in spec.items() if k not in ("model", "added_tokens")}}
    text = json.dumps(spec, indent=None if layout == "spaced" else 2, separators=(" , ", " : ") if layout == "spaced" else None)
    out = json.loads(fast.without_added_tokens(text.encode()))
    assert out == {**spec, "added_tokens": []}


# name -> (file, its first records, config's input section, tokenizer): the whole-run identity set
REAL_RUNS = {
    "t0": ("t0-train-50k/t0_train_50k_per_template.jsonl.gz", 400, {"type": "prompt_completion"}, "qwen2.5"),
    "hh": ("hh-rlhf/harmless-base-test.jsonl.gz", 300, {"type": "transcript", "text_key": "chosen"}, "phi3"),
    "demo": ("llamafactory-demo/reason_tool_use_demo_50.jsonl", 50, {"type": "chat"}, "qwen3"),
    "glaive": ("llamafactory-demo/glaive_toolcall_zh_demo.json", None, {"type": "sharegpt"}, "qwen2.5"),
}


@pytest.mark.skipif(not SHARED.is_dir(), reason="needs ../shared/data")
@pytest.mark.parametrize("name", list(REAL_RUNS))
def test_real_runs_are_byte_identical_with_either_backend(name: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import gzip
    import itertools

    monkeypatch.setattr(backend, "AUTO_MIN_BYTES", 0)
    file, records, section, tok = REAL_RUNS[name]
    path = SHARED / file
    src = tmp_path / path.name.removesuffix(".gz")
    if records is None:
        src.write_bytes(path.read_bytes())
    else:
        with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8") as f:
            src.write_text("".join(itertools.islice(f, records)), encoding="utf-8")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"input": section}))
    flags = ["--config", str(config), "--tokenizer", str(SHARED / f"{tok}-tokenizer"), "--no-cache"]
    auto = etl_run(src, tmp_path / "auto", *flags)
    hf = etl_run(src, tmp_path / "hf", *flags, "--tokenizer-backend", "hf")
    # gigatoken reads tokenizer.json as written: never for a tokenizer transformers rebuilds (Phi-3).
    fast_backend = "hf" if HFTokenizer(SHARED / f"{tok}-tokenizer").pipeline else "gigatoken"
    assert (auto["token_cache"]["backend"], hf["token_cache"]["backend"]) == (fast_backend, "hf")
    assert auto["counts"]["written"] > 0
    assert output_digests(tmp_path / "auto") == output_digests(tmp_path / "hf")


def test_a_tokenizer_gigatoken_cannot_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from etl.cli import main

    monkeypatch.setattr(backend, "AUTO_MIN_BYTES", 0)
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["hello world, it's a test"] * 5, trainers.WordPieceTrainer(
        vocab_size=60, special_tokens=["[UNK]", "<|im_start|>", "<|im_end|>"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    src = write_jsonl(tmp_path / "chats.jsonl", chats(3))
    flags = ["--tokenizer", str(tmp_path / "tokenizer.json"), "--template", "chatml", "--no-cache", "--quiet"]
    assert etl_run(src, tmp_path / "auto", *flags[:-1])["token_cache"]["backend"] == "hf"
    capsys.readouterr()
    assert main(["run", str(src), str(tmp_path / "forced"), *flags, "--tokenizer-backend", "gigatoken"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gigatoken may not encode tokenizer" in err[0] and "WordPiece" in err[0], err
