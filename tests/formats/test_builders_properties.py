"""Property tests: on random valid records, builders equal a plain-Python reference.

Random text covers JSON escapes, control characters and astral-plane characters, so the
SQL's unescaping (`->> '$'`) is checked against `json.loads` on every example.
"""

from __future__ import annotations

import json
from typing import Any

import duckdb
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.formats.builders import BUILDERS, run_builder

ROLES = ("system", "user", "assistant", "tool", "text")
# Any code point but lone surrogates (not valid UTF-8, rejected upstream as invalid JSON).
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=30)
CON = duckdb.connect()


def run(builder: str, recs: list[dict[str, Any]], **options: Any) -> list[dict[str, Any]]:
    lines = [json.dumps(r, ensure_ascii=bool(i % 2)) for i, r in enumerate(recs)]  # both escape styles
    raw = pa.table({"source_line": pa.array(range(len(lines)), pa.int64()), "line": pa.array(lines, pa.large_string())})
    return run_builder(CON, raw, BUILDERS[builder](roles=ROLES, **options)).to_pylist()


# Inline reasoning (`</think>` in assistant content) is split off by the chat builder, a rule with its
# own tests; hypothesis draws that constant from etl's source.
content = st.one_of(TEXT.filter(lambda t: "</think>" not in t), st.lists(st.builds(lambda k, t: {"type": "text", k: t}, st.sampled_from(["text", "value"]),
                                                        TEXT.filter(lambda t: "</think>" not in t)),
                                   min_size=1, max_size=3))
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "bot"]), "content": content},
    optional={"train": st.booleans(), "weight": st.floats(0, 1e6, allow_nan=False)},
)
chat = st.fixed_dictionaries({"messages": st.lists(message, min_size=1, max_size=4)}, optional={"d": TEXT})


def chat_reference(rec: dict[str, Any]) -> list[dict[str, Any]]:
    def text(c: Any) -> str:
        return c if isinstance(c, str) else "".join(p.get("text", p.get("value")) for p in c)

    return [{"role": {"bot": "assistant"}.get(m["role"], m["role"]), "content": text(m["content"]),
             "train": m.get("train"), "weight": m.get("weight"), "reasoning": None, "calls": None, "image_at": None}
            for m in rec["messages"]]


@settings(max_examples=40, deadline=None)
@given(st.lists(chat, min_size=1, max_size=10))
def test_chat_equals_reference(recs: list[dict[str, Any]]) -> None:
    rows = run("chat", recs, role_map={"bot": "assistant"}, domain_key="d")
    assert [r["reason"] for r in rows] == [None] * len(recs)
    assert [r["messages"] for r in rows] == [chat_reference(r) for r in recs]
    assert [r["domain"] for r in rows] == [r.get("d") for r in recs]


alpaca = st.fixed_dictionaries(
    {"instruction": TEXT, "output": TEXT},
    optional={"input": TEXT, "system": TEXT, "history": st.lists(st.tuples(TEXT, TEXT).map(list), max_size=2)},
)


def alpaca_reference(rec: dict[str, Any]) -> list[tuple[str, str]]:
    out = [("system", rec["system"])] if rec.get("system") else []
    for q, a in rec.get("history", []):
        out += [("user", q), ("assistant", a)]
    user = "\n\n".join(t for t in (rec["instruction"], rec.get("input")) if t)  # empty parts left out
    return [*out, ("user", user), ("assistant", rec["output"])]


@settings(max_examples=40, deadline=None)
@given(st.lists(alpaca, min_size=1, max_size=10))
def test_instruction_equals_reference(recs: list[dict[str, Any]]) -> None:
    rows = run("instruction", recs)
    assert [[(m["role"], m["content"]) for m in r["messages"]] for r in rows] == [alpaca_reference(r) for r in recs]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.fixed_dictionaries({"text": TEXT}), min_size=1, max_size=10), st.integers(0, 20))
def test_text_drops_by_character_count(recs: list[dict[str, Any]], min_chars: int) -> None:
    rows = run("text", recs, min_chars=min_chars, max_chars=25)
    want = [("drop:too_short" if len(t) < min_chars else "drop:too_long" if len(t) > 25 else None)
            for t in (r["text"] for r in recs)]
    assert [r["reason"] for r in rows] == want
