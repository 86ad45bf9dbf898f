"""The `transcript` builder: a whole dialogue in one string, turns introduced by role markers.

Anthropic HH-RLHF stores each dialogue as `"\\n\\nHuman: ...\\n\\nAssistant: ..."`. The
markers are one regex alternation, bound as a parameter and matched once to cut the text
(`regexp_split_to_array`) and once to name the turns (`regexp_extract_all`): both use the
same non-overlapping leftmost matches, so piece `i + 1` is the text after marker `i` and
piece 1 is whatever precedes the first marker.
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
)

DEFAULT_MARKERS = {"\n\nHuman:": "user", "\n\nAssistant:": "assistant"}
# Exactly the characters Python's str.isspace() accepts, so `strip` matches str.strip()
# (DuckDB's one-argument trim() removes spaces only).
WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + "\u2028\u2029\u202f\u205f\u3000"
)

# Stripping is two RE2 replaces, each anchored at one end, which RE2 matches from that end without
# scanning the string. DuckDB's trim() with a character set walks the whole string to find its
# right end: on T0-sized turns that cost over ten times the split itself.
STRIPPED = "regexp_replace(regexp_replace(p, $leading_ws, ''), $trailing_ws, '')"


# `pieces[1]` is the text before the first marker; turn i's text is `pieces[i + 1]`.
# `bad_at`: the first turn whose role the template lacks (list_position of the first false).
QUERY = f"""
checked as (
    select
        *,
        case when {is_string("txt")} then txt ->> '$' end as body,
        regexp_split_to_array(body, $pattern) as pieces,
        regexp_extract_all(body, $pattern) as marks,
        list_transform(marks, lambda m: $marker_roles[list_position($marker_list, m)]) as turn_roles,
        list_position(list_transform(turn_roles, lambda r: list_contains($roles, r)), false) as bad_at,
        list_transform(pieces[2:], lambda p: {{content}}) as contents
    from fields
),
final as (
    select
        source_line,
        case {HEAD_REASONS} {absent_reason("txt", "$text_path")}
            when body is null then 'not_a_string'
            when len(marks) = 0 then 'no_turns'
            when regexp_replace(pieces[1], $leading_ws, '') <> '' then 'text_before_first_marker'
            when bad_at is not null then 'unknown_role'
        end as reason,
        case reason {HEAD_DETAILS}
            when 'missing_key' then {missing_detail("$text_key", "$text_path")}
            when 'not_a_string' then '"' || $text_key || '" is ' || {kind("txt")} || ', not a string'
            when 'no_turns' then '"' || $text_key || '" contains none of the markers ' || $marker_names
            when 'text_before_first_marker' then '"' || $text_key || '" has text before the first marker: '
                || to_json(left(regexp_replace(pieces[1], $leading_ws, ''), 60))
            when 'unknown_role' then 'turn ' || (bad_at - 1) || ' (marker ' || to_json(marks[bad_at])
                || ') has role "' || turn_roles[bad_at] || '"; expected one of ' || array_to_string($roles, ', ')
        end as detail,
        case when reason is null then list_transform(turn_roles, lambda r, i: struct_pack(
            role := r, content := contents[i], train := null::boolean, weight := null::double
            )::{MESSAGE_TYPE}) end as messages,
        dom ->> '$' as domain,
        case when reason is not null then left(line, $preview) end as raw
    from checked
)
select source_line, reason, detail, raw, messages, domain from final"""


def query(*, strip: bool) -> str:
    """The SQL after the `records`/`fields` CTEs; `strip` picks the content expression."""
    content = STRIPPED if strip else "p"
    return QUERY.replace("{content}", content)


def _regex_literal(text: str) -> str:
    """An RE2 pattern matching `text` literally: every character but [A-Za-z0-9 ] as `\\x{hex}`.

    Escaping every other character needs no list of what is special in RE2's syntax (which is
    not Python's, the target of `re.escape`), and keeps control characters out of the pattern.
    """
    return "".join(c if (c.isascii() and c.isalnum()) or c == " " else f"\\x{{{ord(c):X}}}" for c in text)


# The characters of WHITESPACE as one RE2 character class (RE2's \s is ASCII-only).
WHITESPACE_CLASS = "[" + _regex_literal(WHITESPACE) + "]"


def marker_pattern(markers: Sequence[str]) -> str:
    """One alternation of all markers, longest first.

    RE2 alternation is leftmost-first, so where one marker is a prefix of another at the same
    position (`"\\n\\nHuman:"` and `"\\n\\nHuman: (aside)"`) the longer one must be tried first.
    """
    ordered = sorted(markers, key=len, reverse=True)
    return "(" + "|".join(_regex_literal(m) for m in ordered) + ")"


def _check_markers(markers: Any) -> dict[str, str]:
    """`markers` must map non-empty marker strings to non-empty role names."""
    if not isinstance(markers, Mapping) or not markers or not all(
        isinstance(k, str) and k and isinstance(v, str) and v for k, v in markers.items()
    ):
        raise EtlError(f"input.markers is {markers!r}; expected a non-empty object of marker string -> role")
    for marker in markers:
        try:
            marker.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate from a JSON "\ud800" escape
            raise EtlError(f"input.markers: {marker!r} is not valid Unicode text") from exc
    return dict(markers)


def transcript_builder(
    *,
    roles: Sequence[str],
    text_key: str = "chosen",
    markers: Mapping[str, str] | None = None,
    strip: bool = True,
    domain_key: str | None = None,
    **_: Any,
) -> BuilderQuery:
    """Records holding a whole dialogue as one string with role markers (HH-RLHF `chosen`).

    Each occurrence of a key of `markers` starts a turn whose role is its value and whose
    content runs to the next marker or the end of the text; matching is exact and
    case-sensitive. Default markers: `"\\n\\nHuman:"` -> user, `"\\n\\nAssistant:"` ->
    assistant; add e.g. `"\\n\\nSystem:": "system"` for system turns. With `strip` (default)
    whitespace around each content is removed as by Python's `str.strip()`. A turn whose
    content is empty is kept (HH-RLHF has dialogues ending in an empty Assistant turn), and
    two consecutive turns of the same role are kept as they are: the pipeline handles
    imperfect alternation.

    Reasons: `missing_key` / `not_a_string` for the `text_key` field, `no_turns` when the
    text holds no marker (an empty text included), `text_before_first_marker` when
    non-whitespace text precedes the first marker, `unknown_role` when a turn's role is not
    one of the template's `roles`.

    Args:
        roles: The template's roles; a turn with any other role rejects its record.
        text_key: The top-level key holding the dialogue text.
        markers: Marker string -> canonical role; None means `DEFAULT_MARKERS`.
        strip: Strip whitespace around each turn's content.
        domain_key: Optional top-level key whose string becomes the row's `domain`.

    Returns:
        The builder's SQL over `raw` with its bound parameters.

    Raises:
        EtlError: An option has the wrong type or shape.
    """
    check_key("text_key", text_key)
    check_key("domain_key", domain_key, optional=True)
    marker_map = _check_markers(DEFAULT_MARKERS if markers is None else markers)
    if not isinstance(strip, bool):
        raise EtlError(f"input.strip is {strip!r}; expected true or false")
    top = Slots("rec")
    slots = {"txt": top.slot(text_key), "dom": top.slot(domain_key)}
    params = base_params(structure=top.structure(), roles=roles) | {
        "text_path": json_key_path(text_key), "text_key": text_key,
        "pattern": marker_pattern(list(marker_map)),
        "marker_list": list(marker_map), "marker_roles": list(marker_map.values()),
        "marker_names": ", ".join(json.dumps(m, ensure_ascii=False) for m in marker_map),
        "leading_ws": "^" + WHITESPACE_CLASS + "+",
    }
    if strip:  # DuckDB rejects parameters the SQL does not use
        params["trailing_ws"] = WHITESPACE_CLASS + "+$"
    return BuilderQuery(sql="with" + records_cte(slots) + "," + query(strip=strip), params=params)
