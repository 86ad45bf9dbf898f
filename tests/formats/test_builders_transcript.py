"""Tests of the `transcript` builder: golden records, options, and the real HH-RLHF test file.

The HH-RLHF test is skipped when ../shared/data is absent; its expected numbers come from
../shared/data/README.md section 4 and from re-parsing the file in plain Python here.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from etl.columns import INVALID_UTF8
from etl.errors import EtlError
from etl.formats.builders import BUILDERS, run_builder
from etl.formats.transcript import WHITESPACE, marker_pattern
from etl.ingest.discover import discover
from etl.ingest.reader import read_chunks
from tests.formats.test_builders import ROLES, build, msg, one, reason

HH = Path(__file__).resolve().parents[3] / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
SYSTEM_MARKERS = {"\n\nHuman:": "user", "\n\nAssistant:": "assistant", "\n\nSystem:": "system"}


def hh(*turns: tuple[str, str]) -> dict[str, str]:
    """An HH-RLHF record whose `chosen` is the given (speaker, text) turns."""
    return {"chosen": "".join(f"\n\n{who}: {text}" for who, text in turns), "rejected": "x"}


# --- golden records --------------------------------------------------------------------------

def test_hh_dialogue_becomes_user_assistant_turns() -> None:
    row = one("transcript", hh(("Human", "Hi there?"), ("Assistant", "Hello."), ("Human", "Bye")))
    assert row["messages"] == [msg("user", "Hi there?"), msg("assistant", "Hello."), msg("user", "Bye")]
    assert (row["reason"], row["detail"], row["raw"], row["domain"]) == (None, None, None, None)


def test_strip_false_keeps_the_text_between_markers() -> None:
    rec = {"chosen": "\n\nHuman:  a \n\nAssistant:b\n"}
    assert one("transcript", rec, strip=False)["messages"] == [msg("user", "  a "), msg("assistant", "b\n")]
    assert one("transcript", rec)["messages"] == [msg("user", "a"), msg("assistant", "b")]


def test_strip_removes_unicode_whitespace_like_str_strip() -> None:
    content = "\u3000\xa0\t x\u2028y \u200a\n\x1c"
    row = one("transcript", {"chosen": "\n\nHuman:" + content})
    assert row["messages"] == [msg("user", content.strip())] == [msg("user", "x\u2028y")]
    assert set(WHITESPACE) == {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()}


def test_empty_turns_and_repeated_roles_are_kept() -> None:
    """An empty turn is allowed (HH-RLHF has dialogues ending in "Assistant:" alone), and two
    turns in a row with one role stay as they are: the pipeline handles imperfect alternation."""
    rec = {"chosen": "\n\nHuman: q\n\nAssistant: a\n\nAssistant: b\n\nHuman:\n\nAssistant:  "}
    assert one("transcript", rec)["messages"] == [
        msg("user", "q"), msg("assistant", "a"), msg("assistant", "b"), msg("user", ""), msg("assistant", "")]


def test_only_exact_markers_split() -> None:
    # Record 172 of the HH test file: "\n\n\nAssistants need" is text, not a turn.
    text = "\n\nHuman: go\n\nAssistant: Joke:\n\n\nAssistants need X\nHuman: no\n\nhuman: lower"
    assert one("transcript", {"chosen": text})["messages"] == [
        msg("user", "go"), msg("assistant", "Joke:\n\n\nAssistants need X\nHuman: no\n\nhuman: lower")]


def test_whitespace_before_the_first_marker_is_allowed() -> None:
    assert one("transcript", {"chosen": " \n\t\n\nHuman: hi"})["messages"] == [msg("user", "hi")]
    assert one("transcript", {"chosen": "Human: hi"}, markers={"Human:": "user"})["messages"] == [msg("user", "hi")]


def test_custom_markers_system_role_key_and_domain() -> None:
    rec = {"dialog": "\n\nSystem: Be kind.\n\nHuman: hi\n\nAssistant: yo", "src": "hh"}
    row = one("transcript", rec, text_key="dialog", markers=SYSTEM_MARKERS, domain_key="src")
    assert row["messages"] == [msg("system", "Be kind."), msg("user", "hi"), msg("assistant", "yo")]
    assert row["domain"] == "hh"


def test_markers_are_literal_text_not_regex() -> None:
    markers = {"[U]*": "user", "(.)|$": "assistant", "it's \\d": "tool"}
    text = "[U]* a (.)|$ b it's \\d c UUU x"
    assert one("transcript", {"chosen": text}, markers=markers)["messages"] == [
        msg("user", "a"), msg("assistant", "b"), msg("tool", "c UUU x")]
    assert marker_pattern(["\n", "a.b"]) == r"(a\x{2E}b|\x{A})"


def test_longer_marker_wins_where_one_is_a_prefix_of_another() -> None:
    markers = {"\n\nHuman:": "user", "\n\nHuman: (aside)": "system", "\n\nAssistant:": "assistant"}
    text = "\n\nHuman: (aside) note\n\nHuman: hi\n\nAssistant: yo"
    assert one("transcript", {"chosen": text}, markers=markers)["messages"] == [
        msg("system", "note"), msg("user", "hi"), msg("assistant", "yo")]


def test_keys_are_data_not_sql() -> None:
    key = "it's \"odd\"; drop table raw; --"
    assert one("transcript", {key: "\n\nHuman: x"}, text_key=key)["messages"] == [msg("user", "x")]
    assert reason("transcript", {"chosen": "x"}, text_key=key) == ("missing_key", f'no "{key}" key; record keys: ["chosen"]')


@pytest.mark.parametrize(("record", "expected"), [
    ("{bad", ("invalid_json", "the line is not valid JSON")),
    (INVALID_UTF8 + "b'\\xff'", ("invalid_utf8", "the line is not valid UTF-8")),
    (["\n\nHuman: x"], ("not_an_object", "the record is a list, not an object")),
    ({"rejected": "\n\nHuman: x"}, ("missing_key", 'no "chosen" key; record keys: ["rejected"]')),
    ({"chosen": None}, ("missing_key", '"chosen" is null; record keys: ["chosen"]')),
    ({"chosen": ["\n\nHuman: x"]}, ("not_a_string", '"chosen" is a list, not a string')),
    ({"chosen": 3}, ("not_a_string", '"chosen" is a number, not a string')),
    ({"chosen": ""}, ("no_turns", '"chosen" contains none of the markers "\\n\\nHuman:", "\\n\\nAssistant:"')),
    ({"chosen": "Human: hi\nAssistant: yo"},
     ("no_turns", '"chosen" contains none of the markers "\\n\\nHuman:", "\\n\\nAssistant:"')),
    ({"chosen": "  Note: red team\n\n\nHuman: hi"},
     ("text_before_first_marker", '"chosen" has text before the first marker: "Note: red team\\n"')),
])
def test_rejects(record: Any, expected: tuple[str, str]) -> None:
    row = one("transcript", record)
    assert (row["reason"], row["detail"]) == expected
    line = record if isinstance(record, str) else json.dumps(record)
    assert row["messages"] is None and row["raw"] == line[:500]


def test_unknown_role_names_the_turn_and_marker() -> None:
    rec = {"chosen": "\n\nHuman: hi\n\nSystem: s"}
    got = reason("transcript", rec, markers=SYSTEM_MARKERS, roles=("user", "assistant"))
    assert got == ("unknown_role", 'turn 1 (marker "\\n\\nSystem:") has role "system"; expected one of user, assistant')
    # Only records that use the marker are rejected: the others still fit the template.
    ok = one("transcript", {"chosen": "\n\nHuman: hi"}, markers=SYSTEM_MARKERS, roles=("user", "assistant"))
    assert ok["messages"] == [msg("user", "hi")]


def test_first_problem_wins_and_rows_keep_their_lines() -> None:
    rows = build("transcript", hh(("Human", "a")), {"chosen": "x"}, {"chosen": "pre\n\nSystem: s"},
                 markers=SYSTEM_MARKERS, roles=("user",))
    assert [(r["source_line"], r["reason"]) for r in rows] == [
        (0, None), (1, "no_turns"), (2, "text_before_first_marker")]


@pytest.mark.parametrize(("options", "match"), [
    ({"text_key": ""}, "input.text_key"),
    ({"domain_key": 3}, "input.domain_key"),
    ({"markers": {}}, "input.markers"),
    ({"markers": ["\n\nHuman:"]}, "input.markers"),
    ({"markers": {"": "user"}}, "input.markers"),
    ({"markers": {"H:": 1}}, "input.markers"),
    ({"markers": {"\ud800": "user"}}, "not valid Unicode"),
    ({"strip": "yes"}, "input.strip"),
    ({"text_key": "t", "domain_key": "t"}, None),  # one key for both fields is allowed
])
def test_options(options: dict[str, Any], match: str | None) -> None:
    if match is None:
        assert BUILDERS["transcript"](roles=ROLES, **options)
        return
    with pytest.raises(EtlError, match=match):
        BUILDERS["transcript"](roles=ROLES, **options)


# --- the real HH-RLHF test file --------------------------------------------------------------

HH_MARKER = re.compile(r"(\n\nHuman:|\n\nAssistant:)")
HH_ROLE = {"\n\nHuman:": "user", "\n\nAssistant:": "assistant"}
# README section 4: Human turns per `chosen` dialogue.
HUMAN_TURNS = {1: 662, 2: 584, 3: 590, 4: 354, 5: 69, 6: 20, 7: 16, 8: 7, 9: 5, 10: 1, 11: 2, 12: 1, 18: 1}


def python_turns(text: str) -> list[dict[str, Any]]:
    """The reference parse: `re.split` on the markers, each content `str.strip()`ped."""
    parts = HH_MARKER.split(text)
    assert parts[0] == ""  # every HH-RLHF dialogue starts with its first marker
    return [msg(HH_ROLE[parts[i]], parts[i + 1].strip()) for i in range(1, len(parts), 2)]


@pytest.mark.skipif(not HH.is_file(), reason="../shared/data/hh-rlhf is absent")
@pytest.mark.parametrize("key", ["chosen", "rejected"])
def test_hh_rlhf_test_file(key: str) -> None:
    with gzip.open(HH, "rt", encoding="utf-8") as fh:
        recs = [json.loads(line) for line in fh]
    query = BUILDERS["transcript"](roles=ROLES, text_key=key)
    con = duckdb.connect()
    table = pa.concat_tables(run_builder(con, c, query) for s in discover(str(HH)) for c in read_chunks(s))
    assert table.num_rows == len(recs) == 2312
    assert table.column("reason").null_count == 2312  # no rejects
    got = table.column("messages").to_pylist()
    assert got == [python_turns(r[key]) for r in recs]
    # The README's distribution holds for both fields (the rejected reply differs only in its
    # last Assistant turn in 2,307 of 2,312 records).
    assert Counter(sum(m["role"] == "user" for m in conv) for conv in got) == HUMAN_TURNS
    if key == "chosen":
        # The README's "mismatched Human/Assistant counts": 8 dialogues have two Assistant turns
        # in a row (one more Assistant than Human turn), kept as they are; 4 end with an empty
        # Assistant turn.
        repeated = [i for i, conv in enumerate(got) if any(a["role"] == b["role"] for a, b in pairwise(conv))]
        assert repeated == [667, 763, 1254, 1319, 1688, 1849, 1952, 2036]
        counts = [Counter(m["role"] for m in conv) for conv in got]
        assert [i for i, c in enumerate(counts) if c["user"] != c["assistant"]] == repeated
        assert all(counts[i]["assistant"] == counts[i]["user"] + 1 for i in repeated)
        assert [i for i, conv in enumerate(got) if any(m["content"] == "" for m in conv)] == [86, 516, 925, 1103]
        assert all(conv[-1] == msg("assistant", "") for conv in (got[86], got[516], got[925], got[1103]))
