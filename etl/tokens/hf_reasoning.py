"""How a chat_template renders an assistant turn's `reasoning_content`, found by probing it.

Qwen3's template writes `<think>\\nR\\n</think>\\n\\n` before the content of assistant turns after
the last user query, an empty block on the final turn when it has no reasoning, and nothing on
earlier turns. Three probes recover that as a `ReasoningFormat` (the strings around a marker
reasoning, the turn rule `keep`, `empty_last`); `block_remover` then deletes such blocks from
every other probe's text, so the rest of the template derives as constant per-role strings.
A template that never renders `reasoning_content` gives None: etl then drops reasoning, as the
template does, and says so in the template's notes.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from etl.tokens.hf_probe import MARKER, Probe, Unsupported
from etl.tokens.templates import ReasoningFormat

TAG = re.compile(r"<[^<>\s]+>")  # an XML-like tag: the think markers when no added token names them
THOUGHT = MARKER.format(70)


def _tags(text: str, tokens: list[str]) -> list[re.Match[str]]:
    """Structure marks in `text`: added tokens if any occur, else XML-like tags."""
    named = [m for t in tokens for m in re.finditer(re.escape(t), text)]
    return sorted(named, key=lambda m: m.start()) if named else list(TAG.finditer(text))


def _around(probe: Probe, tokens: list[str]) -> ReasoningFormat | None:
    """open/pre/post/close/after from a final turn with a marker reasoning."""
    text = probe.render([{"role": "user", "content": MARKER.format(0)},
                         {"role": "assistant", "content": MARKER.format(1), "reasoning_content": THOUGHT}])
    at = text.find(THOUGHT)
    if at < 0:
        return None
    before, after = text[:at], text[at + len(THOUGHT): text.find(MARKER.format(1))]
    opens, closes = _tags(before, tokens), _tags(after, tokens)
    if not opens or not closes:
        raise Unsupported("assistant", f"reasoning is rendered without a tag around it ({before[-20:]!r} ... "
                                       f"{after!r}); etl needs an open and a close mark")
    o, c = opens[-1], closes[0]
    return ReasoningFormat(open=o.group(0), pre=before[o.end():], post=after[: c.start()], close=c.group(0),
                           after=after[c.end():])


def block_remover(fmt: ReasoningFormat) -> Callable[[str], str]:
    """Delete every rendered block (any reasoning, the empty one included) from a text."""
    block = re.compile(re.escape(fmt.open + fmt.pre) + ".*?" + re.escape(fmt.post + fmt.close + fmt.after), re.DOTALL)
    return lambda text: block.sub("", text)


def derive_reasoning(probe: Probe, tokens: list[str]) -> ReasoningFormat | None:
    """The template's reasoning format and turn rule, or None when it renders no reasoning."""
    fmt = _around(probe, tokens)
    if fmt is None:
        return None
    two = probe.render([
        {"role": "user", "content": MARKER.format(0)},
        {"role": "assistant", "content": MARKER.format(1), "reasoning_content": MARKER.format(71)},
        {"role": "user", "content": MARKER.format(2)},
        {"role": "assistant", "content": MARKER.format(3), "reasoning_content": MARKER.format(72)},
    ])
    keep = "all" if MARKER.format(71) in two else "last"
    plain = probe.render([{"role": "user", "content": MARKER.format(0)},
                          {"role": "assistant", "content": MARKER.format(1)}])
    empty_last = fmt.open in plain[plain.find(MARKER.format(0)):]
    return ReasoningFormat(open=fmt.open, pre=fmt.pre, post=fmt.post, close=fmt.close, after=fmt.after,
                           keep=keep, empty_last=empty_last, content_lstrip=_content_lstrip(probe, fmt))


def _content_lstrip(probe: Probe, fmt: ReasoningFormat) -> str:
    """The characters the template strips from a content's start after a block (Qwen3: "\n"),
    found by rendering a content that starts with two of each whitespace character."""
    stripped = ""
    for ch in "\n\r\t ":
        text = probe.render([{"role": "user", "content": MARKER.format(0)},
                             {"role": "assistant", "content": ch * 2 + MARKER.format(1), "reasoning_content": THOUGHT}])
        block_end = text.find(fmt.close, text.find(THOUGHT)) + len(fmt.close)
        if not text[block_end: text.find(MARKER.format(1))].removeprefix(fmt.after).startswith(ch):
            stripped += ch
    return stripped
