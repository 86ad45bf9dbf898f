"""How a chat_template renders tools, tool calls and tool results, found by probing it.

Marker tools, calls and results are rendered in a few conversations and the text around them
is read off as the strings of a `ToolFormat` (Qwen's shape: the list closes the system turn,
calls follow the content, consecutive results share one turn; see `etl.tokens.tool_format`).
`derive_tool_format` then renders a conversation using every string and compares it with the
text the format predicts: a template of another shape (Llama 3.1's tools in the first user turn,
say) raises `Unsupported`, and `hf` falls back to a constant tool role or none.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from etl.tokens.hf_probe import MARKER, Probe, Roles, Unsupported, split_tail
from etl.tokens.tool_format import ToolFormat
from etl.tokens.tool_json import tojson


def _m(i: int) -> str:
    return MARKER.format(i)


def _tool(i: int) -> dict[str, Any]:
    return {"type": "function", "function": {"name": _m(40 + i), "description": _m(50 + i)}}


def _call(i: int) -> dict[str, Any]:
    return {"type": "function", "function": {"name": _m(60 + i), "arguments": {_m(80 + i): _m(90 + i)}}}


def _args(i: int) -> str:
    return tojson(_call(i)["function"]["arguments"])


def _between(text: str, a: str, b: str, *, role: str = "tool") -> str:
    """The text after the first `a` up to the following `b` (`a` = "" for the start)."""
    i = text.find(a) if a else 0
    j = text.find(b, i + len(a)) if i >= 0 else -1
    if i < 0 or j < 0:
        raise Unsupported(role, f"the template does not render {a or b!r} where a tool format of Qwen's shape has it")
    return text[i + len(a): j]


def _cut(text: str, suffix: str, *, what: str) -> str:
    if not text.endswith(suffix):
        raise Unsupported("tool", f"{what}: {text!r} does not end with {suffix!r}")
    return text[: len(text) - len(suffix)]


def _common_suffix(texts: Sequence[str]) -> str:
    return os.path.commonprefix([t[::-1] for t in texts])[::-1]


def _tool_list(probe: Probe, roles: Roles) -> dict[str, str]:
    tools = [_tool(0), _tool(1)]
    t0, t1 = tojson(tools[0]), tojson(tools[1])
    text = probe.render([{"role": "system", "content": _m(0)}, {"role": "user", "content": _m(1)}], tools)
    before = _between(text, _m(0), t0)
    tool_before = _between(text, t0, t1)
    after = _cut(_between(text, t1, _m(1)), roles.tail["system"] + roles.header["user"], what="after the tool list")
    bare = probe.render([{"role": "user", "content": _m(1)}], tools)
    start = _between(bare, "", t0)
    if not start.startswith(roles.header["system"]):
        raise Unsupported("tool", f"without a system message the tool list is not in a system turn ({start[:40]!r})")
    return {"system_glue": _cut(before, tool_before, what="before the first tool"), "tool_before": tool_before,
            "no_system": _cut(start[len(roles.header["system"]):], tool_before, what="before the first tool"),
            "list_after": after}


def _calls(probe: Probe, roles: Roles) -> dict[str, str]:
    user = {"role": "user", "content": _m(0)}
    text = probe.render([user, {"role": "assistant", "content": _m(1), "tool_calls": [_call(0), _call(1)]}])
    n0, n1 = _m(60), _m(61)
    close = _cut(text[text.rfind(_args(1)) + len(_args(1)):], roles.tail["assistant"], what="after the last call")
    after_content = _between(text, _m(1), n0)
    between = _between(text, _args(0), n1)
    if not between.startswith(close):
        raise Unsupported("tool", f"calls are not joined after their close {close!r} ({between!r})")
    empty = probe.render([user, {"role": "assistant", "content": "", "tool_calls": [_call(0)]}])
    first_empty = _between(empty, _m(0) + roles.tail["user"] + roles.header["assistant"], n0)
    opened = _common_suffix([after_content, between[len(close):], first_empty])
    return {"call_lead": after_content[: len(after_content) - len(opened)],
            "call_lead_empty": first_empty[: len(first_empty) - len(opened)], "call_open": opened,
            "call_mid": _between(text, n0, _args(0)), "call_close": close,
            "_between_lead": between[len(close): len(between) - len(opened)]}


def _results(probe: Probe, roles: Roles, specials: Sequence[str], close: str) -> dict[str, str]:
    ask = [{"role": "user", "content": _m(0)}, {"role": "assistant", "content": "", "tool_calls": [_call(0)]}]
    three = probe.render(ask + [{"role": "tool", "content": _m(i)} for i in (2, 3, 4)]
                         + [{"role": "assistant", "content": _m(5)}])
    first = _between(three, _args(0), _m(2))
    if not first.startswith(close + roles.tail["assistant"]):
        raise Unsupported("tool", f"a tool result does not start a turn of its own after the call ({first!r})")
    mid = _between(three, _m(2), _m(3))
    last_gap = _cut(_between(three, _m(4), _m(5)), roles.header["assistant"], what="after the last result")
    end, sep, _token = split_tail(last_gap, specials, role="tool")
    shared = os.path.commonprefix([mid, end])
    shared = shared[: shared.rfind(">") + 1] if ">" in shared else shared  # end of the last tag they share
    return {"result_first": first[len(close + roles.tail["assistant"]):], "result_next": mid[len(shared):], "result_end": shared,
            "result_last_end": end, "result_sep": sep}


def _predicted(fmt: ToolFormat, roles: Roles) -> tuple[list[dict[str, Any]], str]:
    """A conversation that uses every string of `fmt`, and the text `fmt` says it renders to."""
    h, t = roles.header, roles.tail

    def calls(first: int, n: int, lead: str) -> str:
        return "".join((lead if i == first else fmt.call_lead) + fmt.call_open + _m(60 + i) + fmt.call_mid
                       + _args(i) + fmt.call_close for i in range(first, first + n))

    messages = [{"role": "system", "content": _m(0)}, {"role": "user", "content": _m(1)},
                {"role": "assistant", "content": _m(2), "tool_calls": [_call(0), _call(1)]},
                {"role": "tool", "content": _m(3)}, {"role": "tool", "content": _m(4)},
                {"role": "assistant", "content": "", "tool_calls": [_call(2)]},
                {"role": "tool", "content": _m(5)}, {"role": "assistant", "content": _m(6)}]
    text = (h["system"] + _m(0) + fmt.system_glue + "".join(fmt.tool_before + tojson(_tool(i)) for i in (0, 1))
            + fmt.list_after + t["system"] + h["user"] + _m(1) + t["user"]
            + h["assistant"] + _m(2) + calls(0, 2, fmt.call_lead) + t["assistant"]
            + fmt.result_first + _m(3) + fmt.result_end + fmt.result_next + _m(4) + fmt.result_last_end
            + fmt.result_sep + h["assistant"] + calls(2, 1, fmt.call_lead_empty) + t["assistant"]
            + fmt.result_first + _m(5) + fmt.result_last_end + fmt.result_sep + h["assistant"] + _m(6)
            + t["assistant"])
    return messages, text


def derive_tool_format(probe: Probe, roles: Roles, *, specials: Sequence[str], added: Sequence[str]) -> ToolFormat:
    """The template's `ToolFormat`, checked on a conversation that uses every string of it."""
    parts = {**_tool_list(probe, roles), **_calls(probe, roles)}
    between_lead = parts.pop("_between_lead")
    if between_lead != parts["call_lead"]:
        raise Unsupported("tool", f"the text between calls ({between_lead!r}) differs from the text after the "
                                  f"content ({parts['call_lead']!r})")
    results = _results(probe, roles, specials, parts["call_close"])
    texts = [*parts.values(), *results.values()]
    fmt = ToolFormat(**parts, **results, structure=tuple(t for t in added if any(t in x for x in texts)))
    messages, expected = _predicted(fmt, roles)
    got = probe.render(messages, [_tool(0), _tool(1)])
    if got != expected:
        at = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
        raise Unsupported("tool", f"a conversation with tools renders {got[at - 20: at + 30]!r} where the derived "
                                  f"tool format gives {expected[at - 20: at + 30]!r}")
    return fmt
