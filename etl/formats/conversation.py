"""Conversation builders: `chat` (OpenAI-style messages) and `sharegpt` (`from`/`value` turns).

Both read a list of message objects and share one query; they differ in key names, the
default role map and whether a top-level `system` field is read. Content is a string or a
list of parts `{type: "text", text|value: ...}`; per-message `train`/`weight` pass through.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from etl.errors import EtlError
from etl.formats.base import (
    HEAD_DETAILS,
    HEAD_REASONS,
    MESSAGE_TYPE,
    NL,
    BuilderQuery,
    Slots,
    absent_reason,
    base_params,
    check_distinct,
    check_key,
    is_string,
    json_key_path,
    kind,
    missing_detail,
    records_cte,
    register_builder,
    type_words,
)
from etl.formats.conversation_sql import PART_DETAIL, PART_ERROR, QUERY, TEXT

SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
    "function_call": "assistant", "observation": "tool", "tool": "tool",
}
DEFAULT_TOOLS_PREFIX = "# Tools\n\n"

def conversation_query(
    *,
    roles: Sequence[str],
    messages_key: str,
    role_key: str,
    content_key: str,
    train_key: str | None,
    weight_key: str | None,
    tool_calls_key: str | None,
    role_map: Mapping[str, str],
    text_part_types: Sequence[str],
    part_separator: str,
    system_key: str | None,
    tools_key: str | None,
    tools_prefix: str,
    domain_key: str | None,
) -> BuilderQuery:
    """The shared query of `chat` and `sharegpt`; every key and string is a bound parameter."""
    for option, key in (("messages_key", messages_key), ("role_key", role_key), ("content_key", content_key)):
        check_key(option, key)
    for option, key in (("train_key", train_key), ("weight_key", weight_key), ("tool_calls_key", tool_calls_key),
                        ("system_key", system_key), ("tools_key", tools_key), ("domain_key", domain_key)):
        check_key(option, key, optional=True)
    check_distinct(role_key=role_key, content_key=content_key, train_key=train_key,
                   weight_key=weight_key, tool_calls_key=tool_calls_key)
    if not isinstance(role_map, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in role_map.items()
    ):
        raise EtlError(f"input.role_map is {role_map!r}; expected an object of source role -> role")
    if isinstance(text_part_types, str) or not all(isinstance(t, str) for t in text_part_types):
        raise EtlError(f"input.text_part_types is {text_part_types!r}; expected a list of part type names")
    if not isinstance(part_separator, str) or not isinstance(tools_prefix, str):
        raise EtlError("input.part_separator and input.tools_prefix must be strings")
    msg = Slots("x")
    per_message = {
        "role": msg.slot(role_key), "content": msg.slot(content_key), "train": msg.slot(train_key),
        "weight": msg.slot(weight_key), "calls": msg.slot(tool_calls_key),
    }
    top = Slots("rec")
    slots = {
        "msgs": top.slot(messages_key, [msg.structure()]),
        "sys": top.slot(system_key), "tools": top.slot(tools_key), "dom": top.slot(domain_key),
    }
    p = "ps[err_at].m."
    body = QUERY.format(
        **per_message,
        part_error=PART_ERROR,
        text=TEXT,
        part_detail=PART_DETAIL,
        role_is_string=is_string("p.m.role"),
        sys_is_string=is_string("sys"),
        nl=NL,
        message=MESSAGE_TYPE,
        head=HEAD_REASONS,
        head_details=HEAD_DETAILS,
        absent_msgs=absent_reason("msgs", "$messages_path", "not_a_list"),
        missing_msgs=missing_detail("$messages_key", "$messages_path"),
        msgs_type=type_words("json_type(line, $messages_path)"),
        msg_type=type_words("json_type(line, $messages_path || '[' || (err_at - 1) || ']')"),
        sys_kind=kind("sys"),
        tools_kind=kind("tools"),
        kind_role=kind(p + "role"),
        kind_calls=kind(p + "calls"),
        kind_content=kind(p + "content"),
    )
    params = base_params(structure=top.structure(), roles=roles) | {
        "messages_path": json_key_path(messages_key),
        "parts": json.dumps([{"type": "JSON", "text": "JSON", "value": "JSON"}]),
        "map_from": list(role_map), "map_to": list(role_map.values()),
        "part_types": list(text_part_types), "sep": part_separator, "tools_prefix": tools_prefix,
        "messages_key": messages_key, "role_key": role_key, "content_key": content_key,
        "train_key": train_key or "", "weight_key": weight_key or "",
        "system_key": system_key or "", "tools_key": tools_key or "", "tool_calls_key": tool_calls_key or "",
    }
    return BuilderQuery(sql="with" + records_cte(slots) + "," + body, params=params)


@register_builder("chat")
def chat_builder(
    *,
    roles: Sequence[str],
    messages_key: str = "messages",
    role_key: str = "role",
    content_key: str = "content",
    train_key: str | None = "train",
    weight_key: str | None = "weight",
    tool_calls_key: str | None = "tool_calls",
    role_map: Mapping[str, str] | None = None,
    text_part_types: Sequence[str] = ("text",),
    part_separator: str = "",
    system_key: str | None = None,
    tools_key: str | None = None,
    tools_prefix: str = DEFAULT_TOOLS_PREFIX,
    domain_key: str | None = None,
    **_: Any,
) -> BuilderQuery:
    """OpenAI-style `{"messages": [{"role", "content"}]}` records.

    Content is a string or a list of parts; the text of parts whose `type` is in
    `text_part_types` is joined with `part_separator` in order (`text` or, LLaMA-Factory's
    spelling, `value`); any other part (an image, audio) rejects the record as
    `unsupported_content`, since silently dropping it would train on a different sample.
    An assistant message's `tool_calls` list is rendered as its compact JSON text: it is the
    whole content when `content` is null or empty, else it follows the content after a
    newline. `train` (bool) and `weight` (number >= 0) per message pass through as
    `train`/`weight` (LLaMA-Factory's v1 data names the weight `loss_weight`). `role_map`
    renames source roles before the roles are checked against the template's. With
    `system_key` / `tools_key` set, a top-level system prompt and tool list are handled as in
    `sharegpt`.
    """
    return conversation_query(
        roles=roles, messages_key=messages_key, role_key=role_key, content_key=content_key,
        train_key=train_key, weight_key=weight_key, tool_calls_key=tool_calls_key,
        role_map=role_map or {}, text_part_types=text_part_types, part_separator=part_separator,
        system_key=system_key, tools_key=tools_key, tools_prefix=tools_prefix, domain_key=domain_key,
    )


@register_builder("sharegpt")
def sharegpt_builder(
    *,
    roles: Sequence[str],
    messages_key: str = "conversations",
    role_key: str = "from",
    content_key: str = "value",
    train_key: str | None = "train",
    weight_key: str | None = "weight",
    role_map: Mapping[str, str] | None = None,
    text_part_types: Sequence[str] = ("text",),
    part_separator: str = "",
    system_key: str | None = "system",
    tools_key: str | None = None,
    tools_prefix: str = DEFAULT_TOOLS_PREFIX,
    domain_key: str | None = None,
    **_: Any,
) -> BuilderQuery:
    """ShareGPT / Vicuna / LLaMA-Factory `{"conversations": [{"from", "value"}]}` records.

    Source roles are renamed by `SHAREGPT_ROLES` (human/gpt/function_call/observation ...)
    updated with `role_map`, so `role_map` can both override and extend it. A non-empty
    top-level `system` string becomes a leading system message, unless the conversation
    already starts with one, which wins (as in LLaMA-Factory). Tools: off by default, because
    how a model sees its tools is a template decision; with `tools_key` set (LLaMA-Factory's
    `tools`, a JSON string or a list), `tools_prefix` + the tools text is appended to the
    system message (one is created when there is none), separated by a blank line.
    """
    if role_map is not None and not isinstance(role_map, Mapping):
        raise EtlError(f"input.role_map is {role_map!r}; expected an object of source role -> role")
    return conversation_query(
        roles=roles, messages_key=messages_key, role_key=role_key, content_key=content_key,
        train_key=train_key, weight_key=weight_key, tool_calls_key=None,
        role_map={**SHAREGPT_ROLES, **(role_map or {})}, text_part_types=text_part_types,
        part_separator=part_separator, system_key=system_key, tools_key=tools_key,
        tools_prefix=tools_prefix, domain_key=domain_key,
    )
