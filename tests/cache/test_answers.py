"""The tokenizer's answers kept by the token cache (`answers.json`): a warm run never parses
tokenizer.json, yet every id it writes (template pieces, default system, vocabulary size in the
manifest) equals a run that parsed it; a damaged answers file is ignored and rewritten."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pytest

from etl.cache import folder as fo
from etl.errors import EtlError
from etl.tokens.hf_tokenizer import HFTokenizer
from etl.tokens.tokenizer import encode_template_text
from tests.cache.common import chats, etl_run, output_digests, write_jsonl

SYSTEM_PROMPT = "You answer briefly."


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "src" / "chats.jsonl", chats(12)).parent


def run_flags(tokenizer: Path, folder: Path, system: str = SYSTEM_PROMPT) -> list[str]:
    """chatml flags, with a config file that sets the default system prompt."""
    config = folder / f"config-{len(system)}.json"
    config.write_text(json.dumps({"default_system": system}))
    return ["--tokenizer", str(tokenizer), "--template", "chatml", "--config", str(config)]


def answers_file(cache: Path) -> Path:
    (path,) = cache.glob(f"*/{fo.ANSWERS_FILE}")
    return path


def never_parsed() -> mock._patch:
    """Fail the test if anything parses a tokenizer.json."""
    return mock.patch("tokenizers.Tokenizer.from_str", side_effect=AssertionError("tokenizer.json parsed"))


def test_warm_run_never_parses_the_tokenizer(src: Path, tiny_tokenizer_path: Path, tmp_path: Path) -> None:
    """Cold: answers written. Warm at another S: nothing parsed, and data, turns and the manifest
    (bar `token_cache`) equal a --no-cache run's at that S."""
    cache, flags = tmp_path / "cache", run_flags(tiny_tokenizer_path, tmp_path)
    etl_run(src, tmp_path / "cold", *flags, "--cache", str(cache))
    saved = json.loads(answers_file(cache).read_text())["answers"]
    # the default system prompt is encoded after its header's text (`etl.tokens.joins.join_fixed`)
    assert "vocab_size" in saved and any(k.startswith("encode:") and k.endswith(SYSTEM_PROMPT) for k in saved)
    assert "id:<|im_start|>" in saved
    with never_parsed():
        warm = etl_run(src, tmp_path / "warm", *flags, "--cache", str(cache), "--seq-len", "64")
    plain = etl_run(src, tmp_path / "plain", *flags, "--no-cache", "--seq-len", "64")
    assert output_digests(tmp_path / "warm") == output_digests(tmp_path / "plain")
    assert {k: v for k, v in warm.items() if k not in ("token_cache", "files", "record_sha256")} == {
        k: v for k, v in plain.items() if k not in ("token_cache", "files", "record_sha256")}
    assert warm["default_system_ids"] and warm["tokenizer"]["vocab_size"] == plain["tokenizer"]["vocab_size"]


def test_a_new_question_parses_the_tokenizer_and_is_kept(src: Path, tiny_tokenizer_path: Path,
                                                         tmp_path: Path) -> None:
    """Another default system prompt is not among the answers: that run parses tokenizer.json,
    and the next run with it does not."""
    cache, flags = tmp_path / "cache", run_flags(tiny_tokenizer_path, tmp_path)
    etl_run(src, tmp_path / "first", *flags, "--cache", str(cache))
    other = run_flags(tiny_tokenizer_path, tmp_path, "Think first.")
    etl_run(src, tmp_path / "second", *other, "--cache", str(cache))
    assert any(k.endswith("\nThink first.") for k in json.loads(answers_file(cache).read_text())["answers"])
    with never_parsed():
        etl_run(src, tmp_path / "third", *other, "--cache", str(cache))


@pytest.mark.parametrize("damage", ["flip", "truncate", "not json"])
def test_damaged_answers_are_ignored_and_rewritten(src: Path, tiny_tokenizer_path: Path, tmp_path: Path,
                                                   damage: str) -> None:
    """A changed id in answers.json fails its checksum: the run asks the tokenizer again (same
    output as --no-cache) and writes whole answers back."""
    cache, flags = tmp_path / "cache", run_flags(tiny_tokenizer_path, tmp_path)
    etl_run(src, tmp_path / "cold", *flags, "--cache", str(cache))
    path = answers_file(cache)
    body = json.loads(path.read_text())
    if damage == "flip":
        body["answers"]["id:<|im_start|>"] += 1
        path.write_text(json.dumps(body))
    else:
        path.write_text(path.read_text()[:40] if damage == "truncate" else "{oops")
    assert fo.read_answers(path.parent) == {}
    etl_run(src, tmp_path / "again", *flags, "--cache", str(cache))
    etl_run(src, tmp_path / "plain", *flags, "--no-cache")
    assert output_digests(tmp_path / "again") == output_digests(tmp_path / "plain")
    assert fo.read_answers(path.parent)["id:<|im_start|>"] == HFTokenizer(tiny_tokenizer_path).special_id("<|im_start|>")


def test_answers_equal_the_tokenizers_own(tiny_tokenizer_path: Path) -> None:
    """A lazy tokenizer answering from remembered answers gives what a parsed one computes."""
    eager = HFTokenizer(tiny_tokenizer_path)
    text = "<|im_start|>assistant\nhi<|im_end|>\n"
    expected = (encode_template_text(eager, text, ["<|im_start|>", "<|im_end|>"]), eager.vocab_size,
                eager.special_strip("<|im_end|>"), eager.special_id("<|nope|>"))
    assert eager.new_answers
    lazy = HFTokenizer(tiny_tokenizer_path, lazy=True)
    lazy.remember(json.loads(json.dumps(eager.answers)))  # as the cache stores them
    with never_parsed():
        got = (encode_template_text(lazy, text, ["<|im_start|>", "<|im_end|>"]), lazy.vocab_size,
               lazy.special_strip("<|im_end|>"), lazy.special_id("<|nope|>"))
    assert got == expected and not lazy.new_answers
    assert lazy.encode_fixed("hi there") == eager.encode("hi there")  # a new question: parsed now
    assert lazy.new_answers


def test_lazy_tokenizer_reports_a_broken_file_at_first_use(tmp_path: Path) -> None:
    """Not parsed at load, the broken file still fails with the usual message when first needed."""
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"not": "a tokenizer"}')
    with pytest.raises(EtlError, match="not a Hugging Face tokenizers file"):
        HFTokenizer(bad)
    lazy = HFTokenizer(bad, lazy=True)
    with pytest.raises(EtlError, match="not a Hugging Face tokenizers file"):
        lazy.special_id("<|im_start|>")
