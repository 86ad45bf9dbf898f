"""Probe a chat_template: render conversations of marker contents and split the text between them.

For a conversation [m0, ..., mn-1] the rendered text is `gap0 m0 gap1 m1 ... gapn`, where
gap0 = bos + header(r0), gapi = end+sep(ri-1) + header(ri) and gapn = end+sep(rn-1) + eos.
Probes ending on different roles give each role's end+sep (its "tail"); the gaps between
turns then give the headers. Every other gap is checked against these: a template whose
strings depend on the position or the neighbours is reported with the role and the reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etl.tokens.chat_jinja import render
from etl.tokens.tokenizer import TextTokenizer
from etl.tokens.tokenizer_json import read_added_tokens

# Alphanumeric so that templates which `trim` or otherwise touch content leave markers intact.
MARKER = "Qx{}Zq"
# Sentinels for the bos/eos variables show where the template uses them.
BOS_SENTINEL, EOS_SENTINEL = "\x1fetl-bos\x1f", "\x1fetl-eos\x1f"
MAIN = ("system", "user", "assistant", "user", "assistant")


class Unsupported(Exception):
    """The template cannot be written as constant per-role strings; the message names the role."""

    def __init__(self, role: str, why: str) -> None:
        super().__init__(f"role {role}: {why}")
        self.role = role


@dataclass(frozen=True)
class AddedToken:
    """An added token of tokenizer.json (the fields that change how template text encodes)."""

    content: str
    special: bool
    lstrip: bool
    rstrip: bool


def added_tokens(tokenizer: TextTokenizer) -> list[AddedToken]:
    """The `added_tokens` of the tokenizer's tokenizer.json (empty for the built-in `bytes`)."""
    path = getattr(tokenizer, "path", None)
    if not path:
        return []
    return [
        AddedToken(t["content"], bool(t.get("special")), bool(t.get("lstrip")), bool(t.get("rstrip")))
        for t in read_added_tokens(Path(path).read_text("utf-8"))
    ]


def whitespace_rules(tokens: Sequence[AddedToken]) -> Callable[[str], str]:
    """Drop whitespace that the tokenizer itself absorbs next to added tokens (lstrip / rstrip).

    Phi-3's `<|user|>`, `<|end|>`, ... have rstrip=true: `"<|user|>\\nHi"` encodes as
    `<|user|>` + `▁Hi`, so a header `"<|user|>\\n"` resolved piece by piece would add tokens
    (`▁`, `<0x0A>`) that whole-text tokenization never produces.
    """

    def alternation(toks: list[str]) -> str:
        return "|".join(re.escape(t) for t in sorted(toks, key=len, reverse=True))

    right = [t.content for t in tokens if t.rstrip]
    left = [t.content for t in tokens if t.lstrip]
    after = re.compile(f"({alternation(right)})\\s+") if right else None
    before = re.compile(f"\\s+({alternation(left)})") if left else None

    def normalize(text: str) -> str:
        text = after.sub(r"\1", text) if after else text
        return before.sub(r"\1", text) if before else text

    return normalize


def _only_at(text: str, token: str, *, start: bool) -> bool:
    at_edge = text.startswith(token) if start else text.endswith(token)
    return at_edge and text.count(token) == 1


@dataclass(frozen=True)
class Probe:
    """One template with its token variables, bos/eos strings and whitespace rule."""

    source: str
    tokens: Mapping[str, str]
    bos: str
    eos: str
    normalize: Callable[[str], str]
    # Removes what the template adds by position and etl renders as a piece of its own (Qwen3's
    # empty think block on the final turn: etl.tokens.hf_reasoning), so the rest reads as constant.
    strip: Callable[[str], str] = str  # (the identity on text) set from it by `dataclasses.replace`

    def text(self, roles: Sequence[str], *, pad: str = "") -> str:
        """The raw rendering (sentinels in place of bos/eos) of marker messages with `roles`."""
        messages = [{"role": r, "content": pad + MARKER.format(i) + pad} for i, r in enumerate(roles)]
        return self.strip(self.raw(messages))

    def raw(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> str:
        """The template's rendering of `messages` (and `tools`), sentinels in place of bos/eos."""
        # jinja2: only when a chat_template is probed
        import jinja2

        tokens = {**self.tokens, "bos_token": BOS_SENTINEL, "eos_token": EOS_SENTINEL}
        try:
            return render(self.source, messages, tokens=tokens, tools=tools)
        except jinja2.TemplateError as exc:
            # The role an error names when the template rejects a whole probe conversation.
            roles = [m["role"] for m in messages]
            role = "tool" if "tool" in roles or tools else roles[0]
            why = f"the template rejects a [{', '.join(roles)}] conversation: {exc}"
            raise Unsupported(role, why) from exc

    def render(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> str:
        """`raw` without bos/eos, whitespace rules and `strip` applied: text to read strings from."""
        text = self.raw(messages, tools).replace(BOS_SENTINEL, "").replace(EOS_SENTINEL, "")
        return self.strip(self.normalize(text))

    def gaps(self, roles: Sequence[str]) -> tuple[list[str], bool, bool]:
        """Text before, between and after the message contents: (gaps, has_bos, has_eos)."""
        text = self.text(roles)
        has_bos = bool(self.bos) and _only_at(text, BOS_SENTINEL, start=True)
        has_eos = bool(self.eos) and _only_at(text, EOS_SENTINEL, start=False)
        text = text.replace(BOS_SENTINEL, self.bos).replace(EOS_SENTINEL, self.eos)
        # Templates that hard-code the token text instead of using the variable.
        has_bos = has_bos or (bool(self.bos) and _only_at(text, self.bos, start=True))
        has_eos = has_eos or (bool(self.eos) and _only_at(text, self.eos, start=False))
        text = self.normalize(text)
        gaps, pos = [], 0
        for i, role in enumerate(roles):
            at = text.find(MARKER.format(i), pos)
            if at < 0:
                raise Unsupported(role, f"the template does not render the content of a {role} message")
            gaps.append(text[pos:at])
            pos = at + len(MARKER.format(i))
        gaps.append(text[pos:])
        if has_bos:
            gaps[0] = gaps[0][len(self.bos):]
        if has_eos:
            gaps[-1] = gaps[-1][: len(gaps[-1]) - len(self.eos)]
        return gaps, has_bos, has_eos


def _strip_prefix(text: str, prefix: str, *, role: str, where: str) -> str:
    if not text.startswith(prefix):
        raise Unsupported(role, f"the text after a {role} turn is {prefix!r} at the end of a conversation "
                                f"but {text!r} {where}; etl needs one constant end-of-turn per role")
    return text[len(prefix):]


def _same(a: str, b: str, *, role: str, what: str) -> None:
    if a != b:
        raise Unsupported(role, f"{what} changes with the position in the conversation ({a!r} vs {b!r})")


@dataclass(frozen=True)
class Roles:
    """What the probes found for system, user and assistant."""

    header: dict[str, str]
    tail: dict[str, str]
    default_system: str | None
    has_bos: bool
    has_eos: bool


def derive_roles(probe: Probe) -> Roles:
    """Headers and tails of system, user and assistant, and the default system text if any."""
    g, has_bos, has_eos = probe.gaps(MAIN)
    su, su_bos, su_eos = probe.gaps(("system", "user"))
    ua, ua_bos, ua_eos = probe.gaps(("user", "assistant"))
    if (su_bos, ua_bos, su_eos, ua_eos) != (has_bos, has_bos, has_eos, has_eos):
        raise Unsupported("system", "the template adds bos/eos to some conversations only")
    tail = {"assistant": g[5], "user": su[2]}
    header = {
        "system": g[0],
        "user": _strip_prefix(g[3], tail["assistant"], role="assistant", where="before a user turn"),
        "assistant": _strip_prefix(g[2], tail["user"], role="user", where="before an assistant turn"),
    }
    if not g[1].endswith(header["user"]):
        raise Unsupported("system", f"the text between a system turn and a user turn is {g[1]!r}, which "
                                    f"does not end with the user header {header['user']!r}")
    tail["system"] = g[1][: len(g[1]) - len(header["user"])]
    _same(g[2], g[4], role="assistant", what="the user -> assistant text")
    _same(g[1], su[1], role="user", what="the system -> user text")
    _same(g[2], ua[1], role="assistant", what="the user -> assistant text")
    _same(g[5], ua[2], role="assistant", what="the text after the last assistant turn")
    return Roles(header, tail, _default_system(ua[0], header, tail), has_bos, has_eos)


def _default_system(first: str, header: dict[str, str], tail: dict[str, str]) -> str | None:
    """The system text the template injects before a first user turn, None when it injects none."""
    if first == header["user"]:
        return None
    before, after = header["system"], tail["system"] + header["user"]
    if first.startswith(before) and first.endswith(after) and len(first) >= len(before) + len(after):
        return first[len(before): len(first) - len(after)]
    raise Unsupported("system", f"without a system message the template renders {first!r} before the "
                                "first user turn, which is neither the user header nor a system turn")


def derive_tool(probe: Probe, roles: Roles) -> tuple[str, str]:
    """(header, tail) of the tool role; raises `Unsupported` when they are not constant."""
    mid, _, _ = probe.gaps(("system", "user", "assistant", "tool", "assistant"))
    last, _, _ = probe.gaps(("system", "user", "assistant", "tool"))
    tool_tail = last[4]
    tool_header = _strip_prefix(mid[3], roles.tail["assistant"], role="assistant", where="before a tool turn")
    _same(mid[4], tool_tail + roles.header["assistant"], role="tool", what="the tool -> assistant text")
    two, _, _ = probe.gaps(("system", "user", "assistant", "tool", "tool", "assistant"))
    if two[4] != tool_tail + tool_header:
        raise Unsupported("tool", f"consecutive tool messages are joined by {two[4]!r}, not by a whole "
                                  "end + header, so a tool turn's strings depend on its neighbours")
    return tool_header, tool_tail


def split_tail(tail: str, specials: Sequence[str], *, role: str) -> tuple[str, str, str | None]:
    """(end, sep, the special token that closes end): the end runs through the last special token.

    Without a special token a non-assistant tail is all end; an assistant turn must close with
    one, since its end-of-turn token is trained and is the default pad id of the loader's collate.
    """
    hits = [(tail.rfind(s) + len(s), s) for s in specials if s in tail]
    if not hits:
        if role == "assistant":
            raise Unsupported(role, f"no special token ends an assistant turn ({tail!r}), so there is no "
                                    "end-of-turn token to train and pad with")
        return tail, "", None
    cut, token = max(hits, key=lambda h: (h[0], len(h[1])))
    return tail[:cut], tail[cut:], token
