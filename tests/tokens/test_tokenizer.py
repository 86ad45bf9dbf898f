"""Token display strings: characters split over several tokens show whole, specials by name."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from etl.tokens.tokenizer import HFTokenizer, join_utf8_pieces

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
TEXT = "日本語のテキスト 🧑\u200d🚀 𝔘 héllo"


class Names:
    def id_to_token(self, i: int) -> str:
        return f"<special {i}>"


def test_pieces_of_one_character_are_joined_on_its_first_token() -> None:
    e, h = "日".encode(), "é".encode()
    pieces = [e[:1], e[1:2], e[2:], b"a", h[:1], h[1:], None, b"\xff"]
    assert join_utf8_pieces(pieces, list(range(8)), Names()) == ["日", "", "", "a", "é", "", "<special 6>", "\ufffd"]


@pytest.mark.parametrize("name", ["qwen2.5-tokenizer", "phi3-tokenizer"])
def test_real_tokenizers_display_text_that_joins_back(name: str) -> None:
    if not (SHARED / name).exists():
        pytest.skip(f"needs ../shared/data/{name}")
    tok = HFTokenizer(SHARED / name)
    ids = tok.encode_texts(pa.array([TEXT]))[0].as_py()
    strings = tok.token_strings(ids)
    assert len(strings) == len(ids)
    assert "".join(strings).strip() == TEXT and "\ufffd" not in "".join(strings)
