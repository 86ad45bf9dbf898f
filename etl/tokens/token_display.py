"""Token ids as display text (`etl inspect`, the report): the bytes each token stands for, with
the pieces of one character joined, whether the vocabulary is byte-level BPE or byte fallback."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


class TokenDisplay:
    """The display strings of a `tokenizers.Tokenizer`'s ids; caches what it reads of the vocabulary."""

    def __init__(self, tok: Any) -> None:
        self._tok = tok
        self._added_ids = set(tok.get_added_tokens_decoder())
        spec = json.loads(tok.to_str())
        self._byte_level = (spec.get("decoder") or {}).get("type") == "ByteLevel"

    def strings(self, ids: Sequence[int]) -> list[str]:
        """Display text per id; a character split over several tokens shows whole on its first
        token and as "" on the rest."""
        return join_utf8_pieces([self._token_bytes(int(i)) for i in ids], ids, self._tok)

    def _token_bytes(self, tid: int) -> bytes | None:
        """The raw bytes a token stands for; None for added tokens (shown by their content)."""
        token = self._tok.id_to_token(tid)
        if token is None or tid in self._added_ids:
            return None
        if self._byte_level:
            return bytes(_BYTE_DECODER.get(ch, 0x3F) for ch in token)
        if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):  # byte fallback
            return bytes([int(token[3:5], 16)])
        return token.replace("\u2581", " ").encode("utf-8")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table that byte-level BPE vocabularies are written in."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = keep[:]
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(keep, map(chr, chars), strict=True))


_BYTE_DECODER = {ch: b for b, ch in _bytes_to_unicode().items()}


def join_utf8_pieces(pieces: list[bytes | None], ids: Sequence[int], tok: Any) -> list[str]:
    """Decode token byte pieces for display, joining the pieces of one character.

    A piece that is not valid UTF-8 alone is joined with the following pieces (up to 4) until
    the bytes decode; the text goes on the first token of the group, "" on the others. Added
    tokens (None) show their content.
    """
    out: list[str] = []
    i = 0
    while i < len(pieces):
        if pieces[i] is None:
            out.append(tok.id_to_token(int(ids[i])) or "")
            i += 1
            continue
        text, width = _decode_group(pieces, i)
        out.extend([text] + [""] * (width - 1))
        i += width
    return out


def _decode_group(pieces: list[bytes | None], i: int) -> tuple[str, int]:
    for j in range(i + 1, min(i + 5, len(pieces)) + 1):
        if pieces[j - 1] is None:
            break
        try:
            return b"".join(pieces[i:j]).decode("utf-8"), j - i  # type: ignore[arg-type]
        except UnicodeDecodeError:
            continue
    return pieces[i].decode("utf-8", errors="replace"), 1  # type: ignore[union-attr]
