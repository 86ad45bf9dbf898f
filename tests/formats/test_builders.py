"""Golden tests of the record builders: hand-written JSON lines -> canonical messages or reasons."""

from __future__ import annotations

import json
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from etl.columns import INPUT_TYPES, INVALID_UTF8
from etl.errors import EtlError
from etl.formats.builders import BUILDERS, BuilderQuery, run_builder

ROLES = ("system", "user", "assistant", "tool", "text")
COLUMNS = ["source_line", "reason", "detail", "raw", "messages", "domain"]
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("train", pa.bool_()), ("weight", pa.float64())])
# Conversation builders add each message's reasoning, tool calls and image offsets, and the
# record's tools and images.
CHAT_MESSAGE = pa.struct([*MESSAGE, ("reasoning", pa.string()), ("calls", pa.list_(pa.string())),
                          ("image_at", pa.list_(pa.int32()))])
# Single-turn builders add image offsets and the record's images (LLaMA-Factory's `<image>` layout).
SINGLE_TURN = ("instruction", "prompt_completion")
IMAGE_MESSAGE = pa.struct([*MESSAGE, ("image_at", pa.list_(pa.int32()))])


def build(builder: str, *records: Any, roles: tuple[str, ...] = ROLES, **options: Any) -> list[dict[str, Any]]:
    """Rows of one builder over records (a str is a raw line, anything else is JSON-encoded)."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    raw = pa.table({"source_line": pa.array(range(len(lines)), pa.int64()), "line": pa.array(lines, pa.large_string())})
    table = run_builder(duckdb.connect(), raw, BUILDERS[builder](roles=roles, **options))
    chat, single = builder in ("chat", "sharegpt"), builder in SINGLE_TURN
    assert table.column_names == COLUMNS + (["tools", "images"] if chat else ["images"] if single else [])
    assert table.schema.field("messages").type.value_type == (
        CHAT_MESSAGE if chat else IMAGE_MESSAGE if single else MESSAGE)
    rows = table.to_pylist()
    for row in rows:  # reasoning / calls compared only where a test expects them
        for m in row["messages"] or []:
            for key in ("reasoning", "calls", "image_at"):
                if m.get(key) is None:
                    m.pop(key, None)
    return rows


def msg(role: str, content: str, train: bool | None = None, weight: float | None = None) -> dict[str, Any]:
    return {"role": role, "content": content, "train": train, "weight": weight}


def one(builder: str, record: Any, **options: Any) -> dict[str, Any]:
    return build(builder, record, **options)[0]


def reason(builder: str, record: Any, **options: Any) -> tuple[str | None, str | None]:
    row = one(builder, record, **options)
    return row["reason"], row["detail"]


# --- chat -----------------------------------------------------------------------------------

def test_chat_strings_train_weight_and_domain() -> None:
    rec = {"messages": [{"role": "user", "content": "hi", "train": True},
                        {"role": "assistant", "content": "yo", "train": False, "weight": 0.5}], "src": "wiki"}
    row = one("chat", rec, domain_key="src")
    assert row["messages"] == [msg("user", "hi", True), msg("assistant", "yo", False, 0.5)]
    assert (row["reason"], row["detail"], row["raw"], row["domain"]) == (None, None, None, "wiki")


def test_chat_content_parts_are_joined_in_order() -> None:
    rec = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "value": "b"}]}]}
    assert one("chat", rec)["messages"] == [msg("user", "ab")]
    assert one("chat", rec, part_separator="\n")["messages"] == [msg("user", "a\nb")]
    think = {"messages": [{"role": "assistant", "content": [{"type": "reasoning", "value": "r"}, {"type": "text", "value": "t"}]}]}
    assert one("chat", think, text_part_types=["reasoning", "text"])["messages"] == [msg("assistant", "rt")]
    assert one("chat", think)["messages"] == [{**msg("assistant", "t"), "reasoning": "r"}]


def test_chat_v1_loss_weight_key() -> None:
    rec = {"messages": [{"role": "user", "content": [{"type": "text", "value": "hi"}], "loss_weight": 0.0},
                        {"role": "assistant", "content": [{"type": "text", "value": "yo"}], "loss_weight": 1}]}
    assert one("chat", rec, weight_key="loss_weight")["messages"] == [msg("user", "hi", None, 0.0), msg("assistant", "yo", None, 1.0)]
    assert one("chat", rec)["messages"][1]["weight"] is None  # default key "weight": not read


def test_chat_tool_calls_render_as_json_text() -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]
    rendered = '[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\\"x\\": 1}"}}]'
    rows = build("chat", {"messages": [{"role": "assistant", "content": None, "tool_calls": calls}]},
                 {"messages": [{"role": "assistant", "content": "Let me look.", "tool_calls": calls}]},
                 {"messages": [{"role": "assistant", "content": "x", "tool_calls": []}]})
    assert [r["messages"][0]["content"] for r in rows] == [rendered, "Let me look.\n" + rendered, "x"]


def test_chat_role_map_and_custom_keys() -> None:
    rec = {"dialog": [{"speaker": "bot", "text": "hi"}]}
    row = one("chat", rec, messages_key="dialog", role_key="speaker", content_key="text", role_map={"bot": "assistant"})
    assert row["messages"] == [msg("assistant", "hi")]


def test_chat_keys_are_data_not_sql() -> None:
    key = "it's \"odd\"; drop table raw; --"
    row = one("chat", {key: [{"role": "user", "content": "x"}]}, messages_key=key)
    assert row["messages"] == [msg("user", "x")]
    assert reason("chat", {"messages": []}, messages_key=key) == ("missing_key", f'no "{key}" key; record keys: ["messages"]')


@pytest.mark.parametrize(("record", "expected"), [
    ("{bad", ("invalid_json", "the line is not valid JSON")),
    (INVALID_UTF8 + "b'\\xff'", ("invalid_utf8", "the line is not valid UTF-8")),
    ([1], ("not_an_object", "the record is a list, not an object")),
    ('"s"', ("not_an_object", "the record is a string, not an object")),
    ({"other": 1}, ("missing_key", 'no "messages" key; record keys: ["other"]')),
    ({"messages": None}, ("missing_key", '"messages" is null; record keys: ["messages"]')),
    ({"messages": "x"}, ("not_a_list", '"messages" is a string, not a list of messages')),
    ({"messages": []}, ("empty_messages", '"messages" is an empty list')),
    ({"messages": [{"role": "user", "content": "a"}, 5]},
     ("message_not_an_object", 'message 1 is a number, not an object with "role" and "content"')),
    ({"messages": [{"role": 3, "content": "x"}]}, ("bad_role", 'message 0 "role" is a number, not a string')),
    ({"messages": [{"content": "x"}]}, ("bad_role", 'message 0 "role" is null or missing, not a string')),
    ({"messages": [{"role": "narrator", "content": "x"}]},
     ("unknown_role", 'message 0 has role "narrator"; expected one of system, user, assistant, tool, text')),
    ({"messages": [{"role": "user", "content": 42}]},
     ("bad_content", 'message 0 "content" is a number, not a string or a list of parts')),
    ({"messages": [{"role": "user"}]}, ("bad_content", 'message 0 has no "content" and no "tool_calls"')),
    ({"messages": [{"role": "assistant", "content": "x", "tool_calls": {}}]},
     ("bad_tool_calls", 'message 0 "tool_calls" is an object, not a list')),
    ({"messages": [{"role": "user", "content": []}]}, ("empty_content", 'message 0 "content" is an empty list of parts')),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "u"}}]}]},
     ("unsupported_content", ('message 0 content part 0 has type "input_audio"; supported part types: '
      'text, reasoning, thinking, tool_call, image, image_url'))),
    ({"messages": [{"role": "user", "content": [{"type": "image", "image": 5}]}]},
     ("bad_content_part", ('message 0 content part 0 of type "image" has no image: expected "image", "url" or "path" '
      '(a path, a URI or {"bytes", "path"}) or "image_url": {"url": ...}'))),
    ({"messages": [{"role": "user", "content": "<image>a"}], "images": []},
     ("image_count_mismatch", '1 image placeholder(s) <image> but "images" holds 0 image(s)')),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text"}]}]},
     ("bad_content_part", 'message 0 content part 1 of type "text" has no string "text" or "value"')),
    ({"messages": [{"role": "user", "content": ["a"]}]},
     ("bad_content_part", 'message 0 content part 0 is not an object with a string "type"')),
    ({"messages": [{"role": "user", "content": "x", "train": "yes"}]},
     ("bad_train", 'message 0 "train" is "yes"; expected true or false')),
    ({"messages": [{"role": "user", "content": "x", "weight": -1}]},
     ("bad_weight", 'message 0 "weight" is -1; expected a number >= 0')),
    ({"messages": [{"role": "user", "content": "x", "weight": "1"}]},
     ("bad_weight", 'message 0 "weight" is "1"; expected a number >= 0')),
])
def test_chat_rejects(record: Any, expected: tuple[str, str]) -> None:
    row = one("chat", record)
    assert (row["reason"], row["detail"]) == expected
    line = record if isinstance(record, str) else json.dumps(record)
    assert row["messages"] is None and row["raw"] == line[:500]


def test_chat_first_problem_wins_and_rows_keep_their_lines() -> None:
    rows = build("chat", {"messages": [{"role": "user", "content": "ok"}]},
                 {"messages": [{"role": "user", "content": 1}, {"role": "x", "content": "y"}]})
    assert [r["source_line"] for r in rows] == [0, 1]
    assert rows[1]["reason"] == "bad_content"  # message 0 comes before message 1's role
    assert one("chat", {"messages": [{"role": "x", "content": "y"}], "pad": "z" * 900})["raw"].endswith("z" * 10)


def test_chat_role_map_shows_in_unknown_role_detail() -> None:
    got = reason("chat", {"messages": [{"role": "bot", "content": "x"}]}, role_map={"bot": "robot"})
    assert got == ("unknown_role", ('message 0 has role "bot" (mapped to "robot"); expected one of '
                   "system, user, assistant, tool, text"))


# --- sharegpt -------------------------------------------------------------------------------

def test_sharegpt_glaive_roles_system_and_tools() -> None:
    rec = {"conversations": [{"from": "human", "value": "hi"}, {"from": "function_call", "value": "{}"},
                             {"from": "observation", "value": "ok"}, {"from": "gpt", "value": "done"}],
           "system": "Be brief.", "tools": "[{\"name\": \"f\"}]"}
    turns = [msg("user", "hi"), msg("assistant", "{}"), msg("tool", "ok"), msg("assistant", "done")]
    assert one("sharegpt", rec, tools_key=None)["messages"] == [msg("system", "Be brief."), *turns]
    with_tools = one("sharegpt", rec)["messages"]
    assert with_tools[0] == msg("system", 'Be brief.\n\n# Tools\n\n[{"name": "f"}]')
    listed = one("sharegpt", {**rec, "system": "", "tools": [{"name": "f"}]}, tools_key="tools", tools_prefix="T:")
    assert listed["messages"][0] == msg("system", 'T:[{"name":"f"}]')


def test_sharegpt_own_system_message_wins_over_field() -> None:
    rec = {"conversations": [{"from": "system", "value": "own"}, {"from": "human", "value": "hi"}], "system": "field"}
    assert one("sharegpt", rec)["messages"] == [msg("system", "own"), msg("user", "hi")]
    assert one("sharegpt", {**rec, "tools": []}, tools_key="tools")["messages"][0] == msg("system", "own")


def test_sharegpt_role_map_extends_and_overrides() -> None:
    rec = {"conversations": [{"from": "bot", "value": "a"}, {"from": "gpt", "value": "b"}]}
    assert reason("sharegpt", rec)[1] == (
        'message 0 has role "bot"; expected one of system, user, assistant, tool, text or a role_map key '
        "(human, user, gpt, assistant, system, function_call, observation, tool)")
    row = one("sharegpt", rec, role_map={"bot": "assistant", "gpt": "user"})
    assert row["messages"] == [msg("assistant", "a"), msg("user", "b")]


@pytest.mark.parametrize(("record", "options", "expected"), [
    ({"messages": []}, {}, ("missing_key", 'no "conversations" key; record keys: ["messages"]')),
    ({"conversations": [{"from": "human", "value": "x"}], "system": 3}, {},
     ("not_a_string", '"system" is a number, not a string')),
    ({"conversations": [{"from": "human", "value": "x"}], "tools": 3}, {"tools_key": "tools"},
     ("bad_tools", '"tools" is a number; expected a JSON string, list or object')),
    ({"conversations": [{"from": "human"}]}, {}, ("bad_content", 'message 0 has no "value"')),
    ({"conversations": [{"from": "human", "value": "x"}], "system": "s"}, {"roles": ("user", "assistant")},
     ("unknown_role", None)),
])
def test_sharegpt_rejects(record: Any, options: dict[str, Any], expected: tuple[str, str | None]) -> None:
    got = reason("sharegpt", record, **options)
    assert got[0] == expected[0] and (expected[1] is None or got[1] == expected[1])


# --- instruction / prompt_completion ---------------------------------------------------------

def test_instruction_alpaca_input_system_and_history() -> None:
    rows = build("instruction", {"instruction": "Do", "input": "", "output": "ok"},
                 {"instruction": "Do", "input": "this", "output": "ok", "system": "S", "history": [["a", "b"]]},
                 {"prompt": "p", "response": "r"})
    assert rows[0]["messages"] == [msg("user", "Do"), msg("assistant", "ok")]
    assert rows[1]["messages"] == [msg("system", "S"), msg("user", "a"), msg("assistant", "b"),
                                   msg("user", "Do\n\nthis"), msg("assistant", "ok")]
    assert rows[2]["messages"] == [msg("user", "p"), msg("assistant", "r")]
    assert one("instruction", {"instruction": "", "input": "x", "output": "y"})["messages"][0] == msg("user", "x")


def test_instruction_alpaca_keys_as_prompt_keys_still_append_input() -> None:
    rec = {"instruction": "Translate", "input": "hola", "output": "hello", "src": "mt"}
    row = one("instruction", rec, prompt_key="instruction", response_key="output", domain_key="src")
    assert (row["messages"], row["domain"]) == ([msg("user", "Translate\n\nhola"), msg("assistant", "hello")], "mt")
    assert one("instruction", rec, input_key=None)["messages"][0] == msg("user", "Translate")


@pytest.mark.parametrize(("record", "expected"), [
    ({"output": "x"}, ("missing_key", 'no "prompt" or "instruction" key (or it is null); record keys: ["output"]')),
    ({"instruction": "x"}, ("missing_key", 'no "response" or "output" key (or it is null); record keys: ["instruction"]')),
    ({"prompt": 1, "response": "r"}, ("not_a_string", '"prompt" is a number, not a string')),
    ({"instruction": "a", "output": ["b"]}, ("not_a_string", '"output" is a list, not a string')),
    ({"instruction": "a", "output": "b", "input": 5}, ("not_a_string", '"input" is a number, not a string')),
    ({"instruction": "a", "output": "b", "system": True}, ("not_a_string", '"system" is a boolean, not a string')),
    ({"instruction": "a", "output": "b", "history": "h"},
     ("bad_history", '"history" is a string, not a list of [user, assistant] pairs')),
    ({"instruction": "a", "output": "b", "history": [["q", "a"], ["q"]]},
     ("bad_history", '"history" item 1 is not a [user, assistant] pair of strings')),
    (7, ("not_an_object", "the record is a number, not an object")),
])
def test_instruction_rejects(record: Any, expected: tuple[str, str]) -> None:
    assert reason("instruction", record) == expected


def test_instruction_needs_user_and_assistant_roles() -> None:
    with pytest.raises(EtlError, match="needs role 'assistant'"):
        BUILDERS["instruction"](roles=("system", "user"))
    got = reason("instruction", {"instruction": "a", "output": "b", "system": "s"}, roles=("user", "assistant"))
    assert got == ("unknown_role", ("the record has a system prompt but the template has no system role; "
                   "expected one of user, assistant"))


def test_prompt_completion_strip_suffix() -> None:
    recs = [{"prompt": "Q?\n", "completion": "yes<|endoftext|>"}, {"prompt": "Q", "completion": "<|endoftext|>no"}]
    assert [r["messages"] for r in build("prompt_completion", *recs, strip_suffix="<|endoftext|>")] == [
        [msg("user", "Q?\n"), msg("assistant", "yes")], [msg("user", "Q"), msg("assistant", "<|endoftext|>no")]]
    assert build("prompt_completion", *recs)[0]["messages"][1]["content"] == "yes<|endoftext|>"
    row = one("prompt_completion", {"q": "a", "a": "b"}, prompt_key="q", completion_key="a")
    assert row["messages"] == [msg("user", "a"), msg("assistant", "b")]
    assert reason("prompt_completion", {"prompt": "a"}) == ("missing_key", 'no "completion" key (or it is null); record keys: ["prompt"]')


# --- text ------------------------------------------------------------------------------------

def test_text_lengths_drop_and_rejects() -> None:
    long = "é" * 60  # characters, not bytes
    rows = build("text", {"text": long, "d": "web"}, {"text": "short"}, {"text": "x" * 101}, {"text": 5},
                 {"body": "x"}, domain_key="d", max_chars=100)
    assert rows[0]["messages"] == [msg("text", long)] and rows[0]["domain"] == "web"
    assert [(r["reason"], r["detail"]) for r in rows[1:]] == [
        ("drop:too_short", '"text" has 5 characters, fewer than min_chars 50'),
        ("drop:too_long", '"text" has 101 characters, more than max_chars 100'),
        ("not_a_string", '"text" is a number, not a string'),
        ("missing_key", 'no "text" key; record keys: ["body"]'),
    ]
    assert one("text", {"content": "hi"}, text_key="content", min_chars=0)["messages"] == [msg("text", "hi")]


def test_text_needs_text_role_and_valid_limits() -> None:
    with pytest.raises(EtlError, match="needs role 'text'"):
        BUILDERS["text"](roles=("user", "assistant"))
    with pytest.raises(EtlError, match="max_chars"):
        BUILDERS["text"](roles=ROLES, min_chars=10, max_chars=5)
    with pytest.raises(EtlError, match="min_chars"):
        BUILDERS["text"](roles=ROLES, min_chars=-1)


# --- options and registry --------------------------------------------------------------------

@pytest.mark.parametrize(("builder", "options", "match"), [
    ("chat", {"messages_key": ""}, "input.messages_key"),
    ("chat", {"role_key": "x", "content_key": "x"}, "must differ"),
    ("chat", {"role_map": {"a": 1}}, "input.role_map"),
    ("sharegpt", {"role_map": ["human"]}, "input.role_map"),
    ("chat", {"text_part_types": "text"}, "input.text_part_types"),
    ("instruction", {"strip_suffix": 3}, "input.strip_suffix"),
    ("chat", {"messages_key": "m", "domain_key": "m"}, "two fields"),
])
def test_bad_options_are_one_clear_error(builder: str, options: dict[str, Any], match: str) -> None:
    with pytest.raises(EtlError, match=match):
        BUILDERS[builder](roles=ROLES, **options)


def test_builders_are_the_input_types() -> None:
    assert tuple(BUILDERS) == INPUT_TYPES


def test_a_builder_in_builders_is_an_input_type() -> None:
    def echo(*, roles: list[str], **_: Any) -> BuilderQuery:
        return BuilderQuery(sql="select source_line, line as reason from raw", params={})

    BUILDERS["echo_test"] = echo
    try:
        raw = pa.table({"source_line": pa.array([0], pa.int64()), "line": pa.array(["x"], pa.large_string())})
        got = run_builder(duckdb.connect(), raw, BUILDERS["echo_test"](roles=ROLES))
        assert got.to_pylist() == [{"source_line": 0, "reason": "x"}]
    finally:
        del BUILDERS["echo_test"]


def test_instruction_one_key_cannot_be_two_fields() -> None:
    with pytest.raises(EtlError, match="both prompt and response"):
        BUILDERS["instruction"](roles=ROLES, prompt_key="text", response_key="text")
    assert BUILDERS["instruction"](roles=ROLES, prompt_key="instruction", response_key="output")  # alpaca keys
