"""Where message content meets template text: what the tokenizer must see with the content so that
per-turn ids are the ids of the whole rendered conversation (DESIGN §3, "the ids are the template's").

Between two control tokens the rendered conversation is one text run: the text a header ends with
after its last control token (its *lead*: ChatML's `assistant\\n`, Qwen3's `\\n\\n` after
`</think>`), the content, and the text an end starts with before its first control token (its
*trail*; none in the shipped templates). A tokenizer may merge across those joins (byte-level BPE:
`\\n` + content `\\n` is `ĊĊ` (271), not `Ċ Ċ`), so the run is tokenized whole and split after.
Two rules change the content itself, as the whole-text tokenization or the template would:

* an added token with `rstrip` (Phi-3's `<|user|>`, `<|end|>`) swallows the whitespace after it,
  the content's leading whitespace too when no lead text stands between (`lstrip`: before it);
* a template may strip the content (Llama 3's `| trim`; Qwen3: `content.lstrip('\\n')` after a think
  block), found by rendering it (`etl.tokens.hf_strip`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from etl.tokens.tokenizer import TextTokenizer, encode_template_text, split_on_specials

# What an added token's lstrip/rstrip swallows: Rust's `char::is_whitespace` (Unicode White_Space),
# which `tokenizers` uses; Python's `str.isspace` also counts U+001C..U+001F, which it keeps.
WHITESPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
              + "\u2028\u2029\u202f\u205f\u3000")


@dataclass(frozen=True)
class Join:
    """The template text on one side of a content and what it strips from the content's edge.

    `text`: the lead (before the content) or trail (after it), tokenized with the content;
    `ids`: its ids alone, the ones the template piece ends (lead) or starts (trail) with;
    `strip`: characters removed from that edge of the content ("" none).
    """

    text: str = ""
    ids: tuple[int, ...] = ()
    strip: str = ""


NO_JOIN = Join()


def _strip_flags(tokenizer: TextTokenizer, token: str) -> tuple[bool, bool]:
    flags = getattr(tokenizer, "special_strip", None)
    return flags(token) if flags is not None else (False, False)


def lead_of(piece: str, control: Sequence[str], tokenizer: TextTokenizer, *, template_strip: str = "") -> Join:
    """The join before a content that follows template string `piece` (a header, a think block).

    Raises nothing; a lead whose ids are not the piece's last ids (it cannot happen with
    `encode_template_text`, which encodes the text after the last control token alone) is left
    out, so the content is tokenized apart as before.
    """
    parts = split_on_specials(piece, control)
    text, token = "", ""
    if parts and not parts[-1][1]:
        text = parts[-1][0]
        token = parts[-2][0] if len(parts) > 1 else ""
    elif parts:
        token = parts[-1][0]
    swallows = bool(token) and _strip_flags(tokenizer, token)[1]
    if swallows:
        text = text.lstrip(WHITESPACE)
    strip = _union(WHITESPACE if swallows and not text else "", template_strip)
    if not text:
        return Join(strip=strip)
    ids = tuple(encode_template_text(tokenizer, text, control))
    whole = encode_template_text(tokenizer, piece, control)
    if not ids or tuple(whole[-len(ids):]) != ids:
        return Join(strip=strip)
    return Join(text=text, ids=ids, strip=strip)


def trail_of(piece: str, control: Sequence[str], tokenizer: TextTokenizer, *, template_strip: str = "") -> Join:
    """The join after a content that template string `piece` (an end) follows."""
    parts = split_on_specials(piece, control)
    text, token = "", ""
    if parts and not parts[0][1]:
        text = parts[0][0]
        token = parts[1][0] if len(parts) > 1 else ""
    elif parts:
        token = parts[0][0]
    swallows = bool(token) and _strip_flags(tokenizer, token)[0]
    if swallows:
        text = text.rstrip(WHITESPACE)
    strip = _union(WHITESPACE if swallows and not text else "", template_strip)
    if not text:
        return Join(strip=strip)
    ids = tuple(encode_template_text(tokenizer, text, control))
    whole = encode_template_text(tokenizer, piece, control)
    if not ids or tuple(whole[: len(ids)]) != ids:
        return Join(strip=strip)
    return Join(text=text, ids=ids, strip=strip)


def _union(a: str, b: str) -> str:
    """Characters of either set (the template strips first, then the tokenizer: one strip of both)."""
    return "".join(dict.fromkeys(a + b))


def joins_json(joins: dict[Any, tuple[Join, Join]]) -> dict[str, Any]:
    """The joins that do something, for the manifest's template entry."""
    return {str(key): {"lead": lead.text, "lead_strip": bool(lead.strip), "trail": trail.text,
                       "trail_strip": bool(trail.strip)}
            for key, (lead, trail) in joins.items() if lead != NO_JOIN or trail != NO_JOIN}


def join_fixed(tokenizer: TextTokenizer, lead: Join, text: str) -> list[int]:
    """Ids of a content the run's settings fix (the default system prompt) after `lead`, as
    `etl.pipeline.joins.split_runs` gives a message's; one that starts with a token straddling
    the join (a prompt opening with a newline after ChatML's `system\\n`) keeps its own ids."""
    text = text.lstrip(lead.strip) if lead.strip else text
    if not lead.text:
        return tokenizer.encode_fixed(text)
    ids = tokenizer.encode_fixed(lead.text + text)
    return ids[len(lead.ids):] if tuple(ids[: len(lead.ids)]) == lead.ids else tokenizer.encode_fixed(text)
