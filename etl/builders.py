"""Record builders: vectorized DuckDB SQL that validates raw JSON records and normalizes them.

A builder turns the `(source_line, line)` table of `etl.reader` into canonical rows
`(source_line, messages list<struct<role, content>>, reason, detail)`; `reason` is null for
good rows and names the first problem otherwise. DuckDB's JSON functions type-check every
record in one pass; Polars' `json_decode` fails a whole batch on the first malformed line
and silently casts numbers to strings, which would hide bad records (see README).
Builders are registered by input type name with `@register_builder`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from etl.reader import INVALID_UTF8

RAW_PREVIEW_CHARS = 500


@dataclass(frozen=True)
class BuilderQuery:
    """SQL over the relation `raw` plus its bound parameters."""

    sql: str
    params: dict[str, Any]


Builder = Callable[..., BuilderQuery]
BUILDERS: dict[str, Builder] = {}


def register_builder(name: str) -> Callable[[Builder], Builder]:
    """Register a builder for `input.type = name` (seed 004's factory registration)."""

    def wrap(fn: Builder) -> Builder:
        BUILDERS[name] = fn
        return fn

    return wrap


def json_key_path(key: str) -> str:
    """A JSONPath for one top-level key, quoted so any key name is safe."""
    return "$." + json.dumps(key)


# Checks shared by every builder: the record must be valid UTF-8 JSON. Fast path: one
# json_valid pass and one json_transform pass; json_type runs only on failing rows (CASE
# evaluates a branch only for the rows that reach it), which keeps the parser at ~250 MB/s.
RECORD_CTE = """
records as (
    select
        source_line,
        line,
        starts_with(line, $invalid_utf8) as bad_utf8,
        not bad_utf8 and json_valid(line) as valid,
        case when valid then struct_extract_at(json_transform(line, $structure), 1) end as field
    from raw
)"""

CHAT_SQL = (
    "with"
    + RECORD_CTE
    + """,
checked as (
    select
        *,
        list_transform(field, lambda m: m.role is null and m.content is null) as not_object,
        list_transform(field, lambda m: coalesce(starts_with(m.role, '"'), false)) as role_ok,
        list_transform(field, lambda m: m.role ->> '$') as roles,
        list_transform(field, lambda m: coalesce(starts_with(m.content, '"'), false)) as content_ok
    from records
),
final as (
    select
        source_line,
        case
            when bad_utf8 then 'invalid_utf8'
            when not valid then 'invalid_json'
            when json_type(line) <> 'OBJECT' then 'not_an_object'
            when json_type(line, $messages_path) is null then 'missing_key'
            when json_type(line, $messages_path) <> 'ARRAY' then 'not_a_list'
            when len(field) = 0 then 'empty_messages'
            when list_bool_or(not_object) then 'message_not_an_object'
            when not list_bool_and(role_ok) then 'bad_role'
            when list_bool_or(list_transform(roles, lambda r: not list_contains($roles, r))) then 'unknown_role'
            when not list_bool_and(content_ok) then 'bad_content'
        end as reason,
        case reason
            when 'invalid_utf8' then 'the line is not valid UTF-8'
            when 'invalid_json' then 'the line is not valid JSON'
            when 'not_an_object' then 'the record is a JSON ' || lower(json_type(line)) || ', not an object'
            when 'missing_key' then 'no ' || $messages_key || ' key'
            when 'not_a_list' then $messages_key || ' is a JSON '
                || lower(json_type(line, $messages_path)) || ', not a list'
            when 'empty_messages' then $messages_key || ' is empty'
            when 'message_not_an_object' then 'message ' || (list_position(not_object, true) - 1)
                || ' is not an object with role and content'
            when 'bad_role' then 'message ' || (list_position(role_ok, false) - 1) || ' has no string role'
            when 'unknown_role' then 'message '
                || (list_position(list_transform(roles, lambda r: list_contains($roles, r)), false) - 1)
                || ' has role "' || list_filter(roles, lambda r: not list_contains($roles, r))[1]
                || '"; expected one of ' || array_to_string($roles, ', ')
            when 'bad_content' then 'message ' || (list_position(content_ok, false) - 1) || ' content is '
                || coalesce(lower(json_type(field[list_position(content_ok, false)].content)), 'missing')
                || ', not a string'
        end as detail,
        case when reason is null then list_transform(
            field, lambda m: struct_pack(role := m.role ->> '$', content := m.content ->> '$')
        ) end as messages,
        case when reason is not null then left(line, $preview) end as raw
    from checked
)
select * from final"""
)


@register_builder("chat")
def chat_builder(*, roles: Sequence[str], messages_key: str = "messages", **_: Any) -> BuilderQuery:
    """OpenAI-style `{"messages": [{"role", "content"}]}` records."""
    return BuilderQuery(
        sql=CHAT_SQL,
        params={
            "invalid_utf8": INVALID_UTF8,
            "messages_path": json_key_path(messages_key),
            "structure": json.dumps({messages_key: [{"role": "JSON", "content": "JSON"}]}),
            "messages_key": messages_key,
            "roles": list(roles),
            "preview": RAW_PREVIEW_CHARS,
        },
    )


def run_builder(con: duckdb.DuckDBPyConnection, raw: pa.Table, query: BuilderQuery) -> pa.Table:
    """Run a builder over one raw chunk; returns the canonical table (good and bad rows)."""
    con.register("raw", raw)
    try:
        return con.sql(query.sql, params=query.params).to_arrow_table()
    finally:
        con.unregister("raw")
