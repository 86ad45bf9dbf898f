"""A key repeated within one JSON object: the first value is read, at every level.

DuckDB's reader keeps the first value (Python's `json` the last); detecting repeats would parse
every record again (json_keys: ~2.6x the builder's parse), so etl reads the first, documented in
the README's "What etl refuses". Tool calls, parsed in Python, follow the same rule.
"""

from __future__ import annotations

from etl.tokens.tool_json import call_parts, parse_tools
from tests.formats.test_builders import build, msg

USER_A = '{"role": "user", "content": "a"}'


def test_a_repeated_top_level_key_reads_its_first_value() -> None:
    line = '{"messages": [' + USER_A + '], "messages": [{"role": "user", "content": "b"}]}'
    assert build("chat", line)[0]["messages"] == [msg("user", "a")]
    # The second value, though invalid, is never looked at.
    assert build("chat", '{"messages": [' + USER_A + '], "messages": 5}')[0]["messages"] == [msg("user", "a")]


def test_a_repeated_message_key_reads_its_first_value() -> None:
    line = '{"messages": [{"role": "user", "role": "assistant", "content": "a", "content": "b"}]}'
    assert build("chat", line)[0]["messages"] == [msg("user", "a")]


def test_a_repeated_instruction_field_reads_its_first_value() -> None:
    line = '{"instruction": "first", "instruction": "second", "output": "o", "output": "p"}'
    assert build("instruction", line)[0]["messages"] == [msg("user", "first"), msg("assistant", "o")]


def test_a_tool_call_name_is_its_first_value_in_sql_and_in_python() -> None:
    named_first = '{"name": "f", "name": "", "arguments": {"x": 1, "x": 2}}'
    empty_first = '{"name": "", "name": "f", "arguments": {}}'
    rows = [build("chat", '{"messages": [' + USER_A + ', {"role": "assistant", "content": "", "tool_calls": ['
                  + call + ']}]}', template_tools=True)[0] for call in (named_first, empty_first)]
    assert [r["reason"] for r in rows] == [None, "bad_tool_call"]
    assert call_parts(rows[0]["messages"][1]["calls"][0]) == ("f", '{"x": 1}')
    assert call_parts('{"function": {"name": "g", "arguments": "{\\"y\\": 1, \\"y\\": 2}"}}') == ("g", '{"y": 1}')
    assert parse_tools('[{"b": 1, "a": 2, "b": 3}]') == [{"b": 1, "a": 2}]  # first value, first place
