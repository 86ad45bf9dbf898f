"""Records too large to keep, and long texts that must stay cheap.

`preprocessing.max_record_bytes` / `--max-record-mb`: a longer record is rejected
(`record_too_large`) before it is parsed, the others are written, the counts add up. Below the
limit, `HFTokenizer.encode_texts` cuts long texts into pieces where the tokenizer provably
starts a new pre-token: its ids must equal those of the whole text, for every text.
Memory itself is measured in bench/big_record.py, not here.
"""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import etl.tokens.hf_tokenizer as hf
from etl.cli import main
from etl.config.build import config_from_dict
from etl.config.run_config import RunConfig
from etl.errors import EtlError
from etl.formats.builders import (
    BUILDERS,
    DEFAULT_MAX_RECORD_BYTES,
    TOO_LARGE,
    build_query,
    record_bytes,
    run_builder,
)
from etl.ingest.reader import RAW_SCHEMA
from etl.tokens import cutting

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
QWEN = SHARED / "qwen2.5-tokenizer"
PHI3 = SHARED / "phi3-tokenizer"
needs_shared = pytest.mark.skipif(not QWEN.is_dir(), reason="../shared/data is absent")
ROLES = ["system", "user", "assistant"]


def chat_line(content: str) -> str:
    return json.dumps({"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": "ok"}]})


def write(path: Path, lines: list[str], newline: str = "\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes("".join(line + newline for line in lines).encode("utf-8"))
    return path


def run(src: Path, dst: Path, *flags: str) -> dict:
    assert main(["run", str(src), str(dst), "--quiet", *flags]) == 0
    return json.loads((dst / "_manifest.json").read_text())


def rejects(dst: Path) -> list[dict]:
    return pq.read_table(dst / "_rejects").to_pylist()


# --- rejecting records over the limit ------------------------------------------------------


def test_record_over_limit_is_rejected_and_the_others_written(tmp_path: Path) -> None:
    big = chat_line("x" * 2000)
    src = write(tmp_path / "in" / "a.jsonl", [chat_line("hi"), big, chat_line("yo"), chat_line("z" * 50)])
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"preprocessing": {"max_record_bytes": 1000}}))
    manifest = run(src, tmp_path / "out", "--config", str(cfg))
    n = manifest["counts"]
    assert n["read"] == 4 and n["written"] == 3 and n["rejected"] == {TOO_LARGE: 1}
    assert n["read"] == n["written"] + sum(n["dropped"].values()) + sum(n["rejected"].values())
    (row,) = rejects(tmp_path / "out")
    assert row["source_line"] == 1 and row["reason"] == TOO_LARGE
    assert row["raw"] == big[:500]
    size = len(big.encode())
    assert f"{size:,} bytes" in row["detail"] and "1,000" in row["detail"]
    assert "preprocessing.max_record_bytes" in row["detail"] and "--max-record-mb" in row["detail"]
    assert manifest["config"]["max_record_bytes"] == 1000 and manifest["config"]["input_options"] == {}
    written = pq.read_table(tmp_path / "out" / "data").column("source_line").to_pylist()
    assert sorted(written) == [0, 2, 3]


@pytest.mark.parametrize("newline", ["\n", "\r\n", ""])
def test_limit_counts_the_json_text_not_its_line_end(tmp_path: Path, newline: str) -> None:
    line = chat_line("abc")
    size = len(line.encode())
    src = write(tmp_path / "a.jsonl", [line], newline)
    raw = pa.table({"source_line": [0], "line": pa.array([src.read_text(encoding="utf-8")], pa.large_string())},
                   schema=RAW_SCHEMA)
    assert record_bytes(raw.column("line")).tolist() == [size]
    con = duckdb.connect()
    for limit, reason in ((size, None), (size - 1, TOO_LARGE)):
        out = run_builder(con, raw, build_query("chat", roles=ROLES, options={}, max_record_bytes=limit))
        assert out.column("reason").to_pylist() == [reason]


def test_cli_flag_sets_and_overrides_the_limit(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [chat_line("a" * 3000), chat_line("b")])
    cfg = tmp_path / "cfg.toml"
    cfg.write_text("[preprocessing]\nmax_record_bytes = 100_000\n")
    kept = run(src, tmp_path / "o1", "--config", str(cfg))
    assert kept["counts"]["rejected"] == {}
    cut = run(src, tmp_path / "o2", "--config", str(cfg), "--max-record-mb", "0.001")  # 1,048 bytes
    assert cut["counts"]["rejected"] == {TOO_LARGE: 1} and cut["counts"]["written"] == 1
    assert cut["config"]["max_record_bytes"] == 1048


def test_default_limit_applies_without_config(tmp_path: Path) -> None:
    assert DEFAULT_MAX_RECORD_BYTES == 16 << 20
    assert BUILDERS["chat"](roles=ROLES).max_record_bytes == DEFAULT_MAX_RECORD_BYTES
    manifest = run(write(tmp_path / "in.jsonl", [chat_line("a")]), tmp_path / "out")
    assert manifest["config"]["max_record_bytes"] == DEFAULT_MAX_RECORD_BYTES and manifest["counts"]["written"] == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1000", "must be an integer"),
        (True, "must be an integer"),
        (1.5, "must be an integer"),
        (None, "must be an integer"),
        (0, "must be a positive number of bytes"),
        (-5, "must be a positive number of bytes"),
    ],
)
def test_bad_config_values_are_errors(value: object, message: str) -> None:
    with pytest.raises(EtlError, match=f"preprocessing.max_record_bytes {message}"):
        RunConfig(**config_from_dict({"preprocessing": {"max_record_bytes": value}}))


def test_limit_is_a_preprocessing_key_only() -> None:
    with pytest.raises(EtlError, match="unknown key input.max_record_bytes"):
        config_from_dict({"input": {"max_record_bytes": 10}})
    with pytest.raises(EtlError, match="max_record_bytes"):
        RunConfig(max_record_bytes=0)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e-9"])
def test_bad_cli_values_are_errors(tmp_path: Path, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    src = write(tmp_path / "in.jsonl", [chat_line("a")])
    assert main(["run", str(src), str(tmp_path / "out"), "--quiet", f"--max-record-mb={value}"]) != 0
    assert "--max-record-mb" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("input_type", "small", "big"),
    [
        ("text", {"text": "t" * 60}, {"text": "t" * 400}),  # over min_chars (50): written
        ("instruction", {"instruction": "i", "output": "o"}, {"instruction": "i" * 400, "output": "o"}),
        ("sharegpt", {"conversations": [{"from": "human", "value": "h"}, {"from": "gpt", "value": "g"}]},
         {"conversations": [{"from": "human", "value": "h" * 400}, {"from": "gpt", "value": "g"}]}),
        ("transcript", {"chosen": "\n\nHuman: h\n\nAssistant: a"},
         {"chosen": "\n\nHuman: " + "h" * 400 + "\n\nAssistant: a"}),
    ],
)
def test_every_input_type_and_file_kind_has_the_limit(tmp_path: Path, input_type: str, small: dict, big: dict) -> None:
    records = [small, big, small]
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"input": {"type": input_type}, "preprocessing": {"max_record_bytes": 300}}))
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "in" / "b.json").write_text(json.dumps(records, indent=1))
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "in" / "c.parquet")
    n = run(tmp_path / "in", tmp_path / "out", "--config", str(cfg))["counts"]
    assert n["read"] == 9 and n["rejected"] == {TOO_LARGE: 3}
    assert n["read"] == n["written"] + sum(n["dropped"].values()) + sum(n["rejected"].values())
    assert sorted((r["source_file"], r["source_line"]) for r in rejects(tmp_path / "out")) == [
        ("a.jsonl", 1), ("b.json", 1), ("c.parquet", 1)]


def test_run_builder_keeps_line_order_and_schema() -> None:
    lines = [chat_line("a"), chat_line("b" * 500), "not json", chat_line("c" * 500), chat_line("d")]
    raw = pa.table({"source_line": list(range(5)), "line": pa.array(lines, pa.large_string())}, schema=RAW_SCHEMA)
    con = duckdb.connect()
    plain = run_builder(con, raw, BUILDERS["chat"](roles=ROLES))
    limited = run_builder(con, raw, build_query("chat", roles=ROLES, options={}, max_record_bytes=400))
    assert limited.schema == plain.schema
    assert limited.column("source_line").to_pylist() == [0, 1, 2, 3, 4]
    assert limited.column("reason").to_pylist() == [None, TOO_LARGE, "invalid_json", TOO_LARGE, None]
    assert limited.column("messages").to_pylist()[4] == plain.column("messages").to_pylist()[4]
    only_big = run_builder(con, raw.slice(1, 1), build_query("chat", roles=ROLES, options={}, max_record_bytes=400))
    assert only_big.schema == plain.schema and only_big.column("reason").to_pylist() == [TOO_LARGE]


# --- long texts: cut into pieces, ids unchanged ---------------------------------------------

# What a cut must survive: spaces of every kind, newlines and \r, combining marks (NFC),
# contractions, digits, CJK, emoji, and strings that are special or added tokens elsewhere.
NASTY = list("ab Z\n\n\r\t  .,'s'S1") + [
    "\u3000", "\xa0", "\u0301", "\u2028", "\x85", "\x1c", "数", "。", "é", "e\u0301", "😀", "'ll", "  \n", "\n ",
    "23", "<tool_call>", "<|im_end|>", "hello", " world", "\n\n\n", "x\ny", "A B",
]
texts = st.lists(st.one_of(st.sampled_from(NASTY), st.text(max_size=6)), max_size=60).map("".join)
LLAMA3 = next(p for p in cutting.SAFE_SPLIT_PATTERNS if r"\p{N}{1,3}" in p)


def trained(pre_tokenizer: object, tmp_path: Path, name: str) -> hf.HFTokenizer:
    """A small byte-level BPE trained here (no download), saved as tokenizer.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    corpus = ["Hello world, it's a test.\nLine two: 123 4567 数据 模型 café\n\n" * 3, "the of and to in is" * 5]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|im_end|>"]))
    path = tmp_path / f"{name}.json"
    tok.save(str(path))
    return hf.HFTokenizer(path)


@pytest.fixture(scope="module")
def small_tokenizers(tmp_path_factory: pytest.TempPathFactory) -> list[hf.HFTokenizer]:
    from tokenizers import Regex, pre_tokenizers

    tmp = tmp_path_factory.mktemp("tok")
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    llama3 = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    return [trained(gpt2, tmp, "gpt2"), trained(llama3, tmp, "llama3")]


def whole(tok: hf.HFTokenizer, text: str) -> list[int]:
    return tok._tok.encode(text, add_special_tokens=False).ids


def pieces_equal_whole(tok: hf.HFTokenizer, batch: list[str]) -> None:
    assert tok.cuttable
    with mock.patch.object(hf, "PIECE_BYTES", 8), mock.patch.object(cutting, "CUT_SEARCH", 16):
        got = tok.encode_texts(pa.array(batch)).to_pylist()
    assert got == [whole(tok, t) for t in batch]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(texts, min_size=1, max_size=4))
def test_cut_texts_encode_like_whole_ones_small_models(batch: list[str], small_tokenizers: list) -> None:
    for tok in small_tokenizers:
        pieces_equal_whole(tok, batch)


@needs_shared
@settings(max_examples=300, deadline=None)
@given(batch=st.lists(texts, min_size=1, max_size=4))
def test_cut_texts_encode_like_whole_ones_qwen(batch: list[str]) -> None:
    pieces_equal_whole(qwen(), batch)


def qwen() -> hf.HFTokenizer:
    if not hasattr(qwen, "tok"):
        qwen.tok = hf.HFTokenizer(QWEN)  # type: ignore[attr-defined]
    return qwen.tok  # type: ignore[attr-defined]


def test_cut_points_are_only_the_two_safe_kinds() -> None:
    text = ("one two\nthree 四\u3000五\n\nsix.\nx " * 50).encode("utf-8")
    raw = np.frombuffer(text, np.uint8)
    cuts = cutting.cut_points(raw, 0, len(raw), 16)
    assert len(cuts) > 10 and np.all(np.diff(cuts) > 0) and cuts[0] > 0 and cuts[-1] < len(raw)
    for p in cuts.tolist():
        space = text[p] == 0x20 and chr(text[p - 1]).isalpha() and chr(text[p + 1]).isalpha()
        newline = text[p - 1] == 0x0A and not chr(text[p]).isspace() and text[p - 2] not in b" \n\r\t"
        assert space or newline, (p, text[p - 3 : p + 3])
    assert cutting.cut_points(np.frombuffer("数据模型".encode() * 40, np.uint8), 0, 480, 16).size == 0


def test_space_chars_cover_every_unicode_space() -> None:
    spaces = {chr(i) for i in range(0x110000) if chr(i).isspace()}
    assert spaces <= set(cutting.SPACE_CHARS)


@needs_shared
def test_which_tokenizers_are_cut() -> None:
    assert qwen().cuttable
    if PHI3.is_dir():  # Prepend("▁") normalizer and no pre-tokenizer: cutting would change ids
        assert not hf.HFTokenizer(PHI3).cuttable


def test_a_tokenizer_with_unsafe_parts_is_encoded_whole(tmp_path: Path) -> None:
    from tokenizers import AddedToken, normalizers, pre_tokenizers

    tok = trained(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), tmp_path, "base")
    assert tok.cuttable
    for change in (
        lambda t: setattr(t, "normalizer", normalizers.Prepend("▁")),
        lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=True)),
        lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Whitespace()),
        lambda t: t.add_tokens([AddedToken("<x>", lstrip=True)]),
        lambda t: t.add_tokens(["two words"]),
        lambda t: t.enable_truncation(16),
    ):
        other = trained(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), tmp_path, "other")
        change(other._tok)
        assert not cutting.cuttable(other._tok)
        text = "hello world\n" * 40
        with mock.patch.object(hf, "PIECE_BYTES", 8):
            assert other.encode_texts(pa.array([text])).to_pylist() == [whole(other, text)]


@needs_shared
def test_long_message_output_is_byte_identical(tmp_path: Path) -> None:
    """A whole run with pieces of 64 bytes writes the same data and turns as one without cuts."""
    lines = [chat_line(("word " * 40 + "\n") * 30), chat_line("short"), chat_line("数据\n模型 " * 200)]
    src = write(tmp_path / "in.jsonl", lines)
    flags = ["--tokenizer", str(QWEN), "--template", "chatml", "--seq-len", "512"]
    with mock.patch.object(hf, "PIECE_BYTES", 1 << 30):
        run(src, tmp_path / "whole", *flags)
    with mock.patch.object(hf, "PIECE_BYTES", 64):
        run(src, tmp_path / "cut", *flags)
    for part in ("data/train/part-00000.parquet", "turns/train/part-00000.parquet"):
        assert (tmp_path / "whole" / part).read_bytes() == (tmp_path / "cut" / part).read_bytes()
