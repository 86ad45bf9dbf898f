"""The `text` builder (pretraining text): one string field -> one message of role `text`.

Records outside the config file's `min_chars` / `max_chars` are drops, not rejects: their reason
starts with `drop:` and the run counts them under `dropped`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from etl.columns import DEFAULT_MAX_CHARS, DEFAULT_MIN_CHARS
from etl.errors import EtlError
from etl.formats.base import (
    HEAD_DETAILS,
    HEAD_REASONS,
    MESSAGE_TYPE,
    BuilderQuery,
    Slots,
    absent_reason,
    base_params,
    check_key,
    is_string,
    json_key_path,
    kind,
    missing_detail,
    records_cte,
    require_roles,
)

# Lengths are in characters (Unicode code points, as Python's len), as the config file defines them.
QUERY = f"""
checked as (
    select *, case when {is_string("txt")} then txt ->> '$' end as content, length(content) as chars
    from fields
),
final as (
    select
        source_line,
        case {HEAD_REASONS} {absent_reason("txt", "$text_path")}
            when content is null then 'not_a_string'
            when chars < $min_chars then 'drop:too_short'
            when chars > $max_chars then 'drop:too_long'
        end as reason,
        case reason {HEAD_DETAILS}
            when 'missing_key' then {missing_detail("$text_key", "$text_path")}
            when 'not_a_string' then '"' || $text_key || '" is ' || {kind("txt")} || ', not a string'
            when 'drop:too_short' then '"' || $text_key || '" has ' || chars
                || ' characters, fewer than min_chars ' || $min_chars
            when 'drop:too_long' then '"' || $text_key || '" has ' || chars
                || ' characters, more than max_chars ' || $max_chars
        end as detail,
        case when reason is null then [struct_pack(role := 'text', content := content,
            train := null::boolean, weight := null::double)::{MESSAGE_TYPE}] end as messages,
        dom ->> '$' as domain,
        case when reason is not null then left(line, $preview) end as raw
    from checked
)
select source_line, reason, detail, raw, messages, domain from final"""


def text_builder(
    *,
    roles: Sequence[str],
    text_key: str = "text",
    min_chars: int = DEFAULT_MIN_CHARS,
    max_chars: int = DEFAULT_MAX_CHARS,
    domain_key: str | None = None,
    **_: Any,
) -> BuilderQuery:
    """Pretraining records `{"text": ...}`: one message of role `text`, no mask.

    Text shorter than `min_chars` or longer than `max_chars` characters is dropped with
    reason `drop:too_short` / `drop:too_long` (`preprocessing.min_chars/max_chars` in a config).
    The template must have a `text` role.
    """
    check_key("text_key", text_key)
    check_key("domain_key", domain_key, optional=True)
    for option, value in (("min_chars", min_chars), ("max_chars", max_chars)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise EtlError(f"preprocessing.{option} is {value!r}; expected an integer >= 0")
    if max_chars < min_chars:
        raise EtlError(f"preprocessing.max_chars ({max_chars}) is below min_chars ({min_chars})")
    require_roles(("text",), roles, "text")
    top = Slots("rec")
    slots = {"txt": top.slot(text_key), "dom": top.slot(domain_key)}
    params = base_params(structure=top.structure(), roles=roles) | {
        "text_path": json_key_path(text_key), "text_key": text_key,
        "min_chars": min_chars, "max_chars": max_chars,
    }
    del params["roles"]  # the one role is checked above; DuckDB rejects unused parameters
    return BuilderQuery(sql="with" + records_cte(slots) + "," + QUERY, params=params)
