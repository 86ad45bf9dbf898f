"""Structure tokens stay structure: an added token (special or not) written in content is text.

Qwen marks `<tool_call>`, `<think>`, ... as non-special added tokens, so a plain tokenizer (and
transformers) maps the text `<tool_call>` in a user message to the tool-call token. etl encodes
content as text, whatever kind of added token it spells.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from etl.tokens.hf_tokenizer import HFTokenizer

QWEN3 = Path(__file__).resolve().parents[3] / "shared" / "data" / "qwen3-tokenizer"


def tiny_tokenizer(tmp: Path) -> Path:
    """A word-level tokenizer: words 0..3, then `<tool_call>` added as a non-special token (4)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<": 1, ">": 2, "hi": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()])
    tok.add_tokens([AddedToken("<tool_call>", special=False)])
    path = tmp / "tokenizer.json"
    tok.save(str(path))
    return path


def test_non_special_added_token_in_content_is_text(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    path = tiny_tokenizer(tmp_path)
    assert Tokenizer.from_file(str(path)).encode("hi <tool_call>").ids == [3, 4]  # the library maps it
    tok = HFTokenizer(path)
    # "<", "tool", "_", "call" (unknown words -> 0), ">": text, never id 4
    assert tok.encode_texts(pa.array(["hi <tool_call>"]))[0].as_py() == [3, 1, 0, 0, 0, 2]
    assert tok.special_id("<tool_call>") == 4  # a template still inserts it by id


@pytest.mark.shared
@pytest.mark.skipif(not QWEN3.is_dir(), reason="../shared/data/qwen3-tokenizer is absent")
def test_qwen3_structure_tokens_in_content_are_text() -> None:
    tok = HFTokenizer(QWEN3)
    text = "call <tool_call> then <think> and </think>, <tool_response> <|im_end|>"
    ids = tok.encode_texts(pa.array([text]))[0].as_py()
    structure = {151645, 151657, 151658, 151665, 151666, 151667, 151668}
    assert not structure & set(ids)
    assert tok.token_strings(ids) and "".join(tok.token_strings(ids)) == text
