"""Reading only a tokenizer.json's `added_tokens` list gives what parsing the whole file gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from etl.tokens.tokenizer_json import added_tokens_span, read_added_tokens
from tests.commands.test_rough_edges import write_tiny_tokenizer

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def test_the_list_alone_equals_the_whole_parse(tmp_path: Path) -> None:
    text = (write_tiny_tokenizer(tmp_path / "tok") / "tokenizer.json").read_text()
    assert added_tokens_span(text) is not None
    assert read_added_tokens(text) == json.loads(text)["added_tokens"]
    assert [t["content"] for t in read_added_tokens(text)][:2] == ["<|bos|>", "<|eos|>"]


def test_another_layout_is_parsed_whole() -> None:
    spec = {"model": {"type": "BPE"}, "added_tokens": [{"content": "<x>", "special": True}]}
    text = json.dumps(spec)
    assert added_tokens_span(text) is None and read_added_tokens(text) == spec["added_tokens"]
    assert read_added_tokens(json.dumps({"version": "1.0"})) == []


@pytest.mark.parametrize("name", ["qwen2.5-tokenizer", "qwen3-tokenizer", "phi3-tokenizer"])
def test_real_tokenizers(name: str) -> None:
    path = SHARED / name / "tokenizer.json"
    if not path.exists():
        pytest.skip("../shared is absent")
    text = path.read_text()
    assert added_tokens_span(text) is not None
    assert read_added_tokens(text) == json.loads(text)["added_tokens"]
