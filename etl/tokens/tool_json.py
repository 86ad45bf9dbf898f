"""Tool calls and tool schemas as chat templates see them: parsed once per distinct JSON text.

The builders keep each call and each record's tool list as JSON text (`calls`, `tools`); a
template renders a call from its name and `arguments | tojson`, and every tool as `tool | tojson`.
These helpers turn the text into those parts the way transformers' templates expect them:

* a call is `{"name", "arguments"}`, whether it came as that (glaive, LLaMA-Factory) or wrapped
  OpenAI-style as `{"type": "function", "function": {...}}`; `parameters` is read as `arguments`;
* `arguments` given as a JSON string (OpenAI's wire format) is parsed to its object, as
  transformers' docs ask of `tool_calls`: Qwen2.5's template would otherwise quote the string
  where Qwen3's pastes it; text that is not JSON stays a string.

`tojson` is transformers' filter (`json.dumps(ensure_ascii=False)`, key order kept). Parsing is
Python per *distinct* text (a chunk of glaive: ~200 calls, ~300 tool lists), never per token.
A key repeated in one object keeps its first value, as DuckDB reads the records (Python's `json`
would keep the last: `{"name": "f", "name": ""}` passed the builder's name check as `f`).
"""

from __future__ import annotations

import json
from typing import Any


class BadToolJson(ValueError):
    """A call or tool list that is not the JSON a template can render; the message says why."""


def tojson(value: Any) -> str:
    """transformers' `tojson` filter with its defaults (no HTML escaping, non-ASCII kept)."""
    return json.dumps(value, ensure_ascii=False)


def _first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose repeated keys keep their first value (and place), as DuckDB reads them."""
    obj = dict(pairs)
    if len(obj) == len(pairs):  # the usual object: no repeats, built in C
        return obj
    obj = {}
    for key, value in pairs:
        obj.setdefault(key, value)
    return obj


def _loads(text: str, what: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_first_wins)
    except json.JSONDecodeError as exc:
        raise BadToolJson(f"{what} is not valid JSON ({exc.msg} at character {exc.pos}): {text[:80]!r}") from exc


def parse_call(text: str) -> dict[str, Any]:
    """One call's JSON text -> `{"name": str, "arguments": object}` (see the module docstring)."""
    call = _loads(text, "tool call")
    if isinstance(call, dict) and isinstance(call.get("function"), dict):
        call = call["function"]
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise BadToolJson(f'tool call has no "name": {text[:80]!r}')
    args = call.get("arguments", call.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args, object_pairs_hook=_first_wins)
        except json.JSONDecodeError:
            pass  # free text arguments: rendered as the JSON string they are
    return {"name": call["name"], "arguments": args}


def call_parts(text: str) -> tuple[str, str]:
    """(name, `arguments | tojson`) of one call's JSON text."""
    call = parse_call(text)
    return call["name"], tojson(call["arguments"])


def parse_tools(text: str) -> list[Any]:
    """A record's tool list (JSON text of a list, or of one tool) -> the list a template iterates."""
    tools = _loads(text, "tools")
    return tools if isinstance(tools, list) else [tools]


def tool_lines(text: str) -> list[str]:
    """`tool | tojson` of every tool of a record's tool list."""
    return [tojson(tool) for tool in parse_tools(text)]
