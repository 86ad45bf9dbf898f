"""What a chat_template strips from a message's content, found by rendering it.

Llama 3's and Gemma's templates write `message['content'] | trim`; Qwen3's `content.lstrip('\\n')`
after a think block (`etl.tokens.hf_reasoning`). etl strips the same characters before it
tokenizes (`etl.tokens.joins`), so the ids stay the template's for any content. Each whitespace
character is tried on each side of every role's content: two of them kept show in the rendering,
two stripped do not.
"""

from __future__ import annotations

from etl.tokens.hf_probe import MAIN, MARKER, Probe, Unsupported

PROBE_CHARS = "\n\r\t "
# Python's `str.strip()` set, which jinja's `trim` uses (all of it below U+3001).
PY_WHITESPACE = "".join(ch for ch in map(chr, range(0x3001)) if ch.isspace())


def _gaps(probe: Probe, left: str, right: str) -> list[str]:
    """Text before, between and after the MAIN probe's contents, each padded with `left`/`right`."""
    messages = [{"role": r, "content": left + MARKER.format(i) + right} for i, r in enumerate(MAIN)]
    text, gaps, pos = probe.strip(probe.raw(messages)), [], 0
    for i, role in enumerate(MAIN):
        at = text.find(MARKER.format(i), pos)
        if at < 0:
            raise Unsupported(role, f"the template does not render the content of a {role} message")
        gaps.append(text[pos:at])
        pos = at + len(MARKER.format(i))
    return gaps + [text[pos:]]


def content_strips(probe: Probe) -> dict[str, tuple[str, str]]:
    """Per role (system, user, assistant): the characters the template strips from the start and the
    end of its content at every place the role takes in the probe ("" none; all of `PROBE_CHARS`:
    jinja's `trim`, Python's whitespace). A strip at some places only (Qwen3's after a think block)
    is not the role's: the think block's own rule says it."""
    plain = [len(g) for g in _gaps(probe, "", "")]
    stripped = {(role, side): set(PROBE_CHARS) for role in MAIN for side in (0, 1)}
    for ch in PROBE_CHARS:
        for side in (0, 1):
            gaps = _gaps(probe, ch * 2 if side == 0 else "", ch * 2 if side == 1 else "")
            for i, role in enumerate(MAIN):
                gap = i if side == 0 else i + 1  # the gap that holds this side's padding
                if len(gaps[gap]) != plain[gap]:
                    stripped[role, side].discard(ch)
    return {role: tuple(_chars(stripped[role, side]) for side in (0, 1)) for role in MAIN}  # type: ignore[misc]


def _chars(found: set[str]) -> str:
    return PY_WHITESPACE if found == set(PROBE_CHARS) else "".join(ch for ch in PROBE_CHARS if ch in found)
