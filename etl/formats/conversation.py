"""The conversation builder and its two shapes: `chat` (OpenAI-style messages) and `sharegpt`
(`from`/`value` turns).

Both read a list of message objects with one builder; a `Shape` gives each its key names, its
default role map, whether a top-level `system` field is read, and its one option of its own. Content is a string or a
list of parts `{type: "text", text|value: ...}`; per-message `train`/`weight` pass through.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from etl.errors import EtlError
from etl.formats.base import (
    CHAT_MESSAGE_TYPE,
    HEAD_DETAILS,
    HEAD_REASONS,
    NL,
    Builder,
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
    type_words,
)
from etl.formats.conversation_sql import (
    CALL_BAD,
    CALL_PARTS,
    PART_DETAIL,
    PART_ERROR,
    PART_REFS,
    PARTS_AT,
    PLACEHOLDER_AT,
    QUERY,
    REASONING_PARTS,
    TEXT,
)
from etl.formats.unread_fields import IGNORE_OPTION, UnreadFields

SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
    "function_call": "assistant", "observation": "tool", "tool": "tool",
}
DEFAULT_TOOLS_PREFIX = "# Tools\n\n"
# Where reasoning comes from: message fields (DeepSeek-R1 / Qwen3 / vLLM `reasoning_content`, the
# first present wins) and content parts (LLaMA-Factory's `reasoning`); tool calls from parts too.
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
REASONING_PART_TYPES = ("reasoning", "thinking")
TOOL_CALL_PART_TYPES = ("tool_call",)
# Image parts: TRL / transformers `{"type": "image", "image" | "url" | "path": ...}` and OpenAI's
# `{"type": "image_url", "image_url": {"url": ...}}`; LLaMA-Factory's and LLaVA's placeholder.
IMAGE_PART_TYPES = ("image", "image_url")
IMAGE_PLACEHOLDER = "<image>"
# Message fields an option reads when set to them: the unread-field warning names the option.
# LLaMA-Factory's v1 data names the weight `loss_weight`; axolotl names the train flag `training`.
FIELD_OPTIONS = {
    "role": "role_key", "from": "role_key", "content": "content_key", "value": "content_key",
    "train": "train_key", "training": "train_key", "weight": "weight_key", "loss_weight": "weight_key",
    "tool_calls": "tool_calls_key", **dict.fromkeys(REASONING_KEYS, "reasoning_keys"),
}


def _check_keys(keys: dict[str, str | None], *, required: tuple[str, ...], reasoning_keys: Sequence[str]) -> None:
    """Key options are non-empty strings (null where optional), and per-message keys differ."""
    for option, key in keys.items():
        check_key(option, key, optional=option not in required)
    per_message = ("role_key", "content_key", "train_key", "weight_key", "tool_calls_key")
    check_distinct(**{o: keys[o] for o in per_message},
                   **{f"reasoning_keys[{i}]": k for i, k in enumerate(reasoning_keys)})


def _check_values(*, role_map: Any, names: dict[str, Any], parse_think: Any, strings: dict[str, Any]) -> None:
    """The role map, the lists of names, the flag and the literal strings have their types."""
    if not isinstance(role_map, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in role_map.items()
    ):
        raise EtlError(f"input.role_map is {role_map!r}; expected an object of source role -> role")
    for option, value in names.items():
        if isinstance(value, str) or not all(isinstance(t, str) and t for t in value):
            raise EtlError(f"input.{option} is {value!r}; expected a list of names")
    if not isinstance(parse_think, bool):
        raise EtlError(f"input.parse_think is {parse_think!r}; expected true or false")
    if not all(isinstance(v, str) for v in strings.values()):
        raise EtlError(f"input.{' and input.'.join(strings)} must be strings")

def _query_body(per_message: dict[str, str]) -> str:
    """`QUERY` with its holes filled: per-message accessors and the shared SQL fragments."""
    p = "ps[err_at].m."
    return QUERY.format(
        **per_message,
        part_error=PART_ERROR,
        text=TEXT,
        part_detail=PART_DETAIL,
        parts_at=PARTS_AT,
        part_refs=PART_REFS,
        placeholder_at=PLACEHOLDER_AT,
        role_is_string=is_string("p.m.role"),
        reasoning_is_string=is_string("p.m.reasoning"),
        reasoning_parts=REASONING_PARTS,
        call_parts=CALL_PARTS,
        call_bad=CALL_BAD,
        kind_reasoning=kind(p + "reasoning"),
        sys_is_string=is_string("sys"),
        nl=NL,
        message=CHAT_MESSAGE_TYPE,
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


# `_conversation_builder` arguments checked by `_validate`: keys (JSON field names), lists of names, strings.
KEY_ARGS = ("messages_key", "role_key", "content_key", "train_key", "weight_key", "tool_calls_key", "system_key",
            "tools_key", "domain_key", "images_key")
NAME_LIST_ARGS = ("text_part_types", "reasoning_part_types", "tool_call_part_types", "reasoning_keys",
                  "tool_call_roles", "image_part_types", IGNORE_OPTION)
STRING_ARGS = ("part_separator", "tools_prefix", "image_placeholder")


def _validate(args: Mapping[str, Any]) -> None:
    """`_conversation_builder`'s arguments (by name) checked before any SQL is built."""
    _check_keys({k: args[k] for k in KEY_ARGS}, required=KEY_ARGS[:3], reasoning_keys=args["reasoning_keys"])
    _check_values(role_map=args["role_map"], parse_think=args["parse_think"],
                  names={k: args[k] for k in NAME_LIST_ARGS}, strings={k: args[k] for k in STRING_ARGS})


def _message_slots(*, role_key: str, content_key: str, train_key: str | None, weight_key: str | None,
                   tool_calls_key: str | None, reasoning_keys: Sequence[str]) -> tuple[Slots, dict[str, str]]:
    """The message fields the query reads, as SQL over a message's JSON (`x`), by output field."""
    msg = Slots("x")
    per_message = {
        "role": msg.slot(role_key), "content": msg.slot(content_key), "train": msg.slot(train_key),
        "weight": msg.slot(weight_key), "calls": msg.slot(tool_calls_key),
    }
    reasoning = [msg.slot(k) for k in reasoning_keys]
    per_message["reasoning"] = f"coalesce({', '.join(reasoning)})" if reasoning else "null::json"
    return msg, per_message


@dataclass(frozen=True)
class Shape:
    """One record shape `_conversation_builder` reads: an input type of its own.

    `defaults`: its defaults where they differ from the builder's (chat's); `fixed`: the options
    it does not offer, at the value they take; `role_map`: source roles it renames, updated by
    the config's `role_map`; `doc`: the input type's description.
    """

    name: str
    defaults: Mapping[str, Any]
    fixed: Mapping[str, Any]
    role_map: Mapping[str, str]
    doc: str


def _conversation_builder(
    *,
    shape: Shape,
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
    tools_key: str | None = "tools",
    tools_prefix: str = DEFAULT_TOOLS_PREFIX,
    domain_key: str | None = None,
    tool_call_roles: Sequence[str] = (),
    reasoning_keys: Sequence[str] = REASONING_KEYS,
    reasoning_part_types: Sequence[str] = REASONING_PART_TYPES,
    tool_call_part_types: Sequence[str] = TOOL_CALL_PART_TYPES,
    parse_think: bool = True,
    ignore_fields: Sequence[str] = (),
    template_tools: bool = False,
    images_key: str | None = "images",
    image_part_types: Sequence[str] = IMAGE_PART_TYPES,
    image_placeholder: str = IMAGE_PLACEHOLDER,
    read_images: bool = True,
    **_: Any,
) -> BuilderQuery:
    """The query of `chat` and `sharegpt` (`shape` says which); every key and string is a bound parameter.

    `read_images` False (a preference side, which has no image columns) leaves image parts
    unsupported, as they were before images were read.

    Its `unread` check warns about message fields that none of the keys reads and
    `ignore_fields` does not list.
    """
    if role_map is not None and not isinstance(role_map, Mapping):
        raise EtlError(f"input.role_map is {role_map!r}; expected an object of source role -> role")
    role_map = {**shape.role_map, **(role_map or {})}
    _validate(locals())
    # A part type read as text is text only (a config that lists `reasoning` in text_part_types).
    reasoning_part_types = [t for t in reasoning_part_types if t not in text_part_types]
    image_part_types = [t for t in image_part_types if t not in text_part_types]
    tool_call_part_types = [t for t in tool_call_part_types if t not in text_part_types]
    msg, per_message = _message_slots(role_key=role_key, content_key=content_key, train_key=train_key,
                                      weight_key=weight_key, tool_calls_key=tool_calls_key,
                                      reasoning_keys=reasoning_keys)
    top = Slots("rec")
    slots = {
        "msgs": top.slot(messages_key, [msg.structure()]),
        "sys": top.slot(system_key), "tools": top.slot(tools_key), "dom": top.slot(domain_key),
        "imgs": top.slot(images_key if read_images else None),
    }
    body = _query_body(per_message)
    params = base_params(structure=top.structure(), roles=roles) | {
        "messages_path": json_key_path(messages_key),
        "parts": json.dumps([dict.fromkeys(("type", "text", "value", "image", "url", "path", "image_url"), "JSON")]),
        "read_images": read_images, "image_part_types": list(image_part_types) if read_images else [],
        "placeholder": image_placeholder, "images_key": images_key or "",
        "map_from": list(role_map), "map_to": list(role_map.values()),
        "part_types": list(text_part_types), "sep": part_separator, "tools_prefix": tools_prefix,
        "reasoning_part_types": list(reasoning_part_types), "tool_call_part_types": list(tool_call_part_types),
        "tool_call_roles": list(tool_call_roles), "parse_think": parse_think, "template_tools": template_tools,
        "reasoning_key": "/".join(reasoning_keys),
        "messages_key": messages_key, "role_key": role_key, "content_key": content_key,
        "train_key": train_key or "", "weight_key": weight_key or "",
        "system_key": system_key or "", "tools_key": tools_key or "", "tool_calls_key": tool_calls_key or "",
    }
    hints = {f: o for f, o in FIELD_OPTIONS.items() if o not in shape.fixed}
    unread = UnreadFields.of(messages_key, read=list(msg.specs), ignored=ignore_fields, hints=hints)
    return BuilderQuery(sql="with" + records_cte(slots) + "," + body, params=params, unread=unread)


def preset(shape: Shape) -> Builder:
    """`_conversation_builder` for one shape, under the shape's own signature: `etl config` lists an
    input type's options and defaults from its builder's keyword arguments."""
    full = inspect.signature(_conversation_builder, eval_str=True).parameters.values()
    offered = [p.replace(default=shape.defaults.get(p.name, p.default)) for p in full
               if p.name not in ("shape", "read_images") and p.name not in shape.fixed]

    def build(**options: Any) -> BuilderQuery:
        # Options of the other shape are ignored, as any option the builder does not take.
        return _conversation_builder(shape=shape, **{**shape.defaults, **options, **shape.fixed})

    build.__name__ = build.__qualname__ = f"{shape.name}_builder"
    build.__doc__ = shape.doc
    build.__signature__ = inspect.Signature(offered, return_annotation=BuilderQuery)  # type: ignore[attr-defined]
    return build


CHAT = Shape("chat", defaults={}, fixed={"tool_call_roles": ()}, role_map={}, doc="""\
OpenAI-style `{"messages": [{"role", "content"}]}` records.

Content is a string or a list of parts; the text of parts whose `type` is in
`text_part_types` is joined with `part_separator` in order (`text` or, LLaMA-Factory's
spelling, `value`); parts of `reasoning_part_types` are the message's reasoning and parts
of `tool_call_part_types` its tool calls; any other part (an image, audio) rejects the
record as `unsupported_content`, since silently dropping it would train on a different
sample. Reasoning also comes from the first of `reasoning_keys` a message has, and, with
`parse_think`, from `<think>...</think>` at the start of assistant content (Qwen3's rule).
Tool calls (`tool_calls_key`, OpenAI's `{type, function: {name, arguments}}` or
`{name, arguments}`) and the top-level tools (`tools_key`) are rendered by a template that
has a tool format (chatml, hf); with any other template a message's calls are their JSON
text after the content (after a newline) and the tools are text in the system message.
`train` (bool) and `weight` (number >= 0) per message pass through as `train`/`weight`
(LLaMA-Factory's v1 data names the weight `loss_weight`). `role_map` renames source roles
before the roles are checked against the template's. With `system_key` / `tools_key` set, a
top-level system prompt and tool list are handled as in `sharegpt`. A message field that
none of the keys reads warns once per run, naming the option that would read it, unless
`ignore_fields` lists it.
""")

SHAREGPT = Shape(
    "sharegpt",
    defaults={"messages_key": "conversations", "role_key": "from", "content_key": "value",
              "system_key": "system", "tool_call_roles": ("function_call",)},
    fixed={"tool_calls_key": None}, role_map=SHAREGPT_ROLES, doc="""\
ShareGPT / Vicuna / LLaMA-Factory `{"conversations": [{"from", "value"}]}` records.

Source roles are renamed by `SHAREGPT_ROLES` (human/gpt/function_call/observation ...)
updated with `role_map`, so `role_map` can both override and extend it. A non-empty
top-level `system` string becomes a leading system message, unless the conversation
already starts with one, which wins (as in LLaMA-Factory). Tools (`tools_key`,
LLaMA-Factory's `tools`, a JSON string or a list) are rendered by a template with a tool
format; with another template `tools_prefix` + the tools text is appended to the system
message (one is created when there is none), separated by a blank line. A message whose
source role is in `tool_call_roles` (glaive's `function_call`) is an assistant tool call
whose content is the call's JSON, under a template with a tool format. Unread message
fields warn as in `chat`.
""")

chat_builder = preset(CHAT)
sharegpt_builder = preset(SHAREGPT)
