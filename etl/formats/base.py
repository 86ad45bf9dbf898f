"""The SQL pieces every builder shares, and `BuilderQuery`, what a builder returns.

A builder is `(*, roles, **options) -> BuilderQuery`: DuckDB SQL over the relation `raw`
`(source_line, line)` returning `source_line, reason, detail, raw, messages, domain`. Every
builder parses each line once with `json_transform` into a struct of the keys it reads (as
JSON text, so a value's own type stays visible), checks that struct with cheap string tests,
and calls `json_type` only inside CASE branches that failing rows alone reach.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from etl.columns import DEFAULT_MAX_RECORD_BYTES, INVALID_UTF8
from etl.errors import EtlError

RAW_PREVIEW_CHARS = 500
# A `missing_key` detail ends with RECORD_KEYS and the record's keys as a JSON list (the
# input-type hint of `etl run` reads them): a dozen keys of 40 characters name a layout and
# keep the line under ~600 characters.
RECORD_KEYS = "; record keys: "
KEYS_SHOWN = 12
KEY_CHARS = 40
# The canonical message; train/weight stay NULL unless the record sets them per message.
MESSAGE_TYPE = "struct(role varchar, content varchar, train boolean, weight double)"
# Conversation builders add a message's reasoning, its tool calls (each call's JSON text) and
# where its images go (character offsets into `content`; NULL without images: etl.images).
CHAT_MESSAGE_TYPE = ("struct(role varchar, content varchar, train boolean, weight double, "
                     "reasoning varchar, calls varchar[], image_at integer[])")
# Builder arguments that the run supplies, not the config: the template's roles, and whether
# the template renders tools and tool calls itself (else they are text in the messages).
RUN_ARGS = ("roles", "template_tools")
NL = "chr(10)"  # DuckDB string literals have no escapes: a newline is chr(10)


TOO_LARGE = "record_too_large"


class _FieldCheck(Protocol):
    """A check of each raw chunk a query parses, run while `con` has it registered as `raw`
    (`etl.formats.unread_fields.UnreadFields`)."""

    def check(self, con: Any, raw: Any) -> None: ...


@dataclass(frozen=True)
class BuilderQuery:
    """SQL over the relation `raw` plus its bound parameters; longer records are rejected unparsed.

    `unread`, for builders of message lists, warns once per query (a run) about message fields
    the query does not read (`etl.formats.unread_fields`). `compose`, for input types parsed by
    other builders' queries (preference pairs), is `(con, raw, run_builder) -> table` and runs
    instead of `sql`, which then only names the parse (the parsed-chunk cache keys on it).
    """

    sql: str
    params: dict[str, Any]
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    unread: _FieldCheck | None = field(default=None, compare=False, repr=False)
    compose: Callable[..., Any] | None = field(default=None, compare=False, repr=False)


Builder = Callable[..., BuilderQuery]  # `(*, roles, **options) -> BuilderQuery`


def json_key_path(key: str) -> str:
    """A JSONPath for one top-level key, quoted so any key name is safe."""
    return "$." + json.dumps(key)


class Slots:
    """The keys one `json_transform` reads, each once, and SQL naming each by position.

    Struct fields are addressed by position (`struct_extract_at(var, 3)`), never by name, so
    user-chosen key names reach DuckDB only inside the bound JSON structure. Two options
    naming the same key share a slot (`prompt_key: "instruction"` reads the alpaca
    `instruction` field); an option left at None reads as SQL NULL.
    """

    def __init__(self, var: str) -> None:
        self.var = var
        self.specs: dict[str, Any] = {}

    def slot(self, key: str | None, spec: Any = "JSON") -> str:
        """SQL for the value of `key` (JSON text, or `spec`'s type), NULL when absent."""
        if key is None:
            return "null::json"
        if self.specs.setdefault(key, spec) != spec:
            raise EtlError(f"input: key {key!r} is configured for two fields with different shapes")
        return f"struct_extract_at({self.var}, {list(self.specs).index(key) + 1})"

    def structure(self) -> dict[str, Any]:
        return dict(self.specs)


def records_cte(slots: dict[str, str]) -> str:
    """CTEs `records` (one parse per line) and `fields` (the named slots of each record)."""
    named = ",\n        ".join(f"{sql} as {name}" for name, sql in slots.items())
    return f"""
records as (
    select
        source_line,
        line,
        starts_with(line, $invalid_utf8) as bad_utf8,
        not bad_utf8 and json_valid(line) as valid,
        case when valid then json_transform(line, $structure) end as rec
    from raw
),
fields as (
    select
        source_line,
        line,
        bad_utf8,
        valid,
        {named}
    from records
)"""


def kind(expr: str) -> str:
    """SQL naming in words the type of a JSON-text value (`json_transform`'s compact output).

    Compact JSON text starts with a character that gives its type, so this needs no parse;
    JSON null and an absent key both arrive as SQL NULL.
    """
    return f"""(case
        when {expr} is null then 'null or missing'
        when starts_with({expr}, '"') then 'a string'
        when starts_with({expr}, '[') then 'a list'
        when starts_with({expr}, '{{') then 'an object'
        when {expr} in ('true', 'false') then 'a boolean'
        else 'a number' end)"""


def type_words(json_type_expr: str) -> str:
    """SQL turning a `json_type` result (VARCHAR, UBIGINT, ...) into words for a detail line."""
    return f"""(case {json_type_expr}
        when 'OBJECT' then 'an object' when 'ARRAY' then 'a list' when 'VARCHAR' then 'a string'
        when 'BOOLEAN' then 'a boolean' when 'NULL' then 'null' else 'a number' end)"""


def is_string(expr: str) -> str:
    return f"coalesce(starts_with({expr}, '\"'), false)"


# Reasons for rows that never parsed. `rec` is NULL for them, and for records that are not
# objects every slot is NULL, so `not_an_object` is tested only where a required slot is NULL.
HEAD_REASONS = """
            when bad_utf8 then 'invalid_utf8'
            when not valid then 'invalid_json'"""


def absent_reason(slot: str, path_param: str, wrong_type: str = "missing_key") -> str:
    """A WHEN clause for a required slot that is NULL: not an object, missing key, or wrong type.

    `wrong_type` is the reason when the key holds a value the slot's type rejected (a list
    slot holding a string); for JSON slots that cannot happen and it is never reached.
    """
    return f"""
            when {slot} is null then case
                when json_type(line) <> 'OBJECT' then 'not_an_object'
                when coalesce(json_type(line, {path_param}), 'NULL') = 'NULL' then 'missing_key'
                else '{wrong_type}' end"""


HEAD_DETAILS = f"""
            when 'invalid_utf8' then 'the line is not valid UTF-8'
            when 'invalid_json' then 'the line is not valid JSON'
            when 'not_an_object' then 'the record is ' || {type_words("json_type(line)")} || ', not an object'"""


def missing_detail(key_param: str, path_param: str) -> str:
    """Detail text for `missing_key`: absent, or present as JSON null; then the record's keys."""
    return with_record_keys(f"""case when json_type(line, {path_param}) = 'NULL' then '"' || {key_param} || '" is null'
                else 'no "' || {key_param} || '" key' end""")


def with_record_keys(detail: str) -> str:
    """SQL appending `RECORD_KEYS` and the record's top-level keys (a JSON list) to a detail.

    `raw` keeps only the first 500 characters, which often end before a long record's keys
    do; the keys, read here from the whole parse, let `etl run` hint at the input type.
    At most KEYS_SHOWN keys of KEY_CHARS characters each, JSON-escaped: one bounded line.
    """
    keys = "json_keys(line)"
    return f"""({detail}) || $record_keys
                || to_json(list_transform({keys}[1:$keys_shown], lambda k: left(k, $key_chars)))
                || case when len({keys}) > $keys_shown then ' (+' || (len({keys}) - $keys_shown) || ' more)'
                    else '' end"""


def record_keys(detail: str | None) -> list[str]:
    """The keys a `missing_key` detail names after `RECORD_KEYS` (empty for any other detail)."""
    at = (detail or "").find(RECORD_KEYS)
    if detail is None or at < 0:
        return []
    try:
        keys = json.JSONDecoder().raw_decode(detail, at + len(RECORD_KEYS))[0]
    except ValueError:
        return []
    return [str(k) for k in keys] if isinstance(keys, list) else []


def base_params(*, structure: dict[str, Any], roles: Sequence[str]) -> dict[str, Any]:
    """Parameters every builder binds."""
    return {
        "invalid_utf8": INVALID_UTF8,
        "structure": json.dumps(structure),
        "roles": list(roles),
        "preview": RAW_PREVIEW_CHARS,
        "record_keys": RECORD_KEYS,
        "keys_shown": KEYS_SHOWN,
        "key_chars": KEY_CHARS,
    }


def check_key(option: str, value: Any, *, optional: bool = False) -> None:
    """A key option must be a non-empty string (or None where the field is optional)."""
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        allowed = "a non-empty string or null" if optional else "a non-empty string"
        raise EtlError(f"input.{option} is {value!r}; expected {allowed}")


def check_distinct(**keys: str | None) -> None:
    """Per-message keys must differ: one JSON key cannot be both role and content."""
    seen: dict[str, str] = {}
    for option, key in keys.items():
        if key is None:
            continue
        if key in seen:
            raise EtlError(f"input.{option} and input.{seen[key]} are both {key!r}; they must differ")
        seen[key] = option


def require_roles(needed: Iterable[str], roles: Sequence[str], input_type: str) -> None:
    """Roles a builder always emits must be template roles: one clear error, not a reject per row."""
    missing = [r for r in needed if r not in roles]
    if missing:
        raise EtlError(
            f"input type {input_type!r} needs role {missing[0]!r}, which the template lacks; "
            f"template roles: {', '.join(roles)}"
        )
