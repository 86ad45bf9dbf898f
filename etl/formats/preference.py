"""The `preference` and `unpaired` input types: pairs (prompt, chosen, rejected) and labelled
completions (KTO), in TRL's layout.

Each side is parsed as one whole conversation by the builders etl already has: message lists
by `chat` (every option, reason and detail of it holds for a pair's messages), hh-rlhf's
transcript strings by `transcript`. A string prompt is a user message and a string completion
an assistant message. With no prompt (TRL's implicit form), the prompt is the messages both
conversations share from the start, as TRL's `extract_prompt` finds it.

A record is parsed three times over (the rewrite, then each side's conversation), ~3x a chat
record's parse: small beside tokenizing, and every side gets the chat builder's checks.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.arrow_values import numbers_of
from etl.columns import SOURCE_LINE
from etl.errors import EtlBug
from etl.formats import conversation, transcript
from etl.formats.base import (
    HEAD_DETAILS,
    HEAD_REASONS,
    BuilderQuery,
    Slots,
    base_params,
    check_key,
    kind,
    records_cte,
    with_record_keys,
)
from etl.formats.pair_sql import (
    COMBINE,
    REWRITE,
    SIDE,
    absent,
    blank,
    finite_number,
    is_text_or_list,
    kind_of_key,
    side_columns,
)
from etl.formats.prepared import run_prepared

# The keys a side's rewritten line holds its conversation under: not options, never user keys.
MESSAGES = "__etl_messages"
# How a side is parsed: the rewrite's prompt + completion messages (`chat`), the side's own
# message list in place (`chat`, no prompt), or its transcript string in place (`transcript`).
LIST, DIRECT, TEXT_ROUTE = "list", "direct", "text"
# Options passed on to the `chat` parse of each side; the transcript parse takes markers and strip.
CHAT_OPTIONS = ("role_key", "content_key", "train_key", "weight_key", "tool_calls_key", "role_map",
                "text_part_types", "part_separator", "system_key", "tools_key", "tools_prefix", "domain_key",
                "reasoning_keys", "reasoning_part_types", "tool_call_part_types", "parse_think", "ignore_fields")
_names = itertools.count()
UNLIMITED = 1 << 62
PAIR_ONLY = ("rejected", "rejected_turns", "score_chosen", "score_rejected")
UNPAIRED_ONLY = ("label",)


def _rewrite(*, sides: Mapping[str, str | None], prompt_key: str | None, label_key: str | None,
             score_keys: tuple[str | None, str | None], roles: Sequence[str], role_key: str,
             content_key: str) -> tuple[str, dict[str, Any]]:
    """The rewrite query and its parameters; `sides` maps side name -> record key."""
    top = Slots("rec")
    named = {"p": top.slot(prompt_key), "lab": top.slot(label_key),
             "sc": top.slot(score_keys[0]), "sr": top.slot(score_keys[1])}
    named |= {f"s_{name}": top.slot(key) for name, key in sides.items()}
    # Without a prompt (the implicit form) a pair's prompt is what both sides share, and an
    # unpaired completion is what follows the conversation's last user turn.
    required = {**sides, "label": label_key} if label_key is not None else dict(sides)
    slot_of = {"prompt_key": "p", "label_key": "lab", "score_chosen_key": "sc", "score_rejected_key": "sr",
               **{f"{name}_key": f"s_{name}" for name in sides}}
    sql = REWRITE.format(
        records=records_cte(named).strip(), head=HEAD_REASONS, head_details=HEAD_DETAILS,
        absent_sides="".join(absent(slot_of[f"{k}_key"], f"{k}_key") for k in required),
        prompt_ok=is_text_or_list("p"), finite_sc=finite_number("sc"), finite_sr=finite_number("sr"),
        bad_sides=" ".join(f"when not {is_text_or_list(f's_{n}')} then 'bad_type:' || ${n}_key" for n in sides),
        label_check="" if label_key is None else "when lab::varchar not in ('true', 'false') then 'label_not_bool'",
        kind_of_key=kind_of_key(slot_of), kind_label=kind("lab"),
        missing=with_record_keys("'no \"' || pre_key || '\" key (or it is null)'"),
        sides=",\n    ".join(side_columns(name, f"s_{name}") for name in sides),
    )
    params = base_params(structure=top.structure(), roles=roles) | {
        "msgs": MESSAGES, "role_key": role_key, "content_key": content_key,
        "prompt_key": prompt_key or "", "label_key": label_key or "",
        "score_chosen_key": score_keys[0] or "", "score_rejected_key": score_keys[1] or "",
        **{f"{name}_key": key for name, key in sides.items()},
    }
    return sql, params


def _combine(paired: bool) -> str:
    """The query joining `meta`, `chosen` (and `rejected`) into the pair table."""
    return COMBINE.format(
        n_rejected="m.n_rejected" if paired else "0",
        rejected_side="r.reason" if paired else "null::varchar",
        rejected_detail="r.detail" if paired else "null::varchar",
        rejected_messages="r.messages" if paired else "c.messages",
        join_rejected="join {rejected} r using (source_line)" if paired else "",
        paired="true" if paired else "false",
        blank_c=blank("c_done"), blank_r=blank("r_done"),
        first="chosen" if paired else "completion",
    )


def _parse_side(con: duckdb.DuckDBPyConnection, raw: pa.Table, meta: pa.Table, name: str, key: str,
                queries: dict[str, dict[str, BuilderQuery]], run: Any) -> pa.Table:
    """One side's conversations, each parsed by the builder its route names; details name the
    record's key, not the rewrite's. A route no record takes is not run (nor planned)."""
    route = meta.column(f"route_{name}")
    rewritten = meta.select([SOURCE_LINE, f"line_{name}"]).rename_columns([SOURCE_LINE, "line"])
    parts = {}
    for way, by_side in queries.items():
        rows = pc.equal(route, way)
        if pc.any(rows).as_py():
            parts[way] = run(con, (rewritten if way == LIST else raw).filter(rows), by_side[name])
    if not parts:  # an empty chunk: any route's empty parse gives the columns
        parts[DIRECT] = run(con, raw, queries[DIRECT][name])
    side = _sql(con, "\nunion all\n".join(SIDE[k].format(table="{" + k + "}") for k in parts), **parts)
    detail = pc.replace_substring(side.column("detail"), MESSAGES, key)
    return side.set_column(side.schema.get_field_index("detail"), "detail", detail)


def _sql(con: duckdb.DuckDBPyConnection, template: str, **tables: pa.Table) -> pa.Table:
    """`template` (`{name}` per table) over Arrow tables registered under unique names: a
    connection may be shared by threads, and a cursor sees its connection's registrations."""
    cur = con.cursor()
    names = {name: f"etl_pair_{name}_{next(_names)}" for name in tables}
    for name, table in tables.items():
        cur.register(names[name], table)
    try:
        return cur.sql(template.format(**names)).to_arrow_table()
    finally:
        cur.close()


def parse_pairs(con: duckdb.DuckDBPyConnection, raw: pa.Table, run: Any, *, rewrite: tuple[str, dict[str, Any]],
                sides: dict[str, str], queries: dict[str, dict[str, BuilderQuery]]) -> pa.Table:
    """The pair table of one raw chunk: `run` (`run_builder`) parses each side's conversation.

    Columns: the builders' `source_line, reason, detail, raw, messages, domain, tools`, with
    `messages` the chosen (or the unpaired) conversation, and `completion_turns` (its last
    messages that are the completion); pairs add `rejected`, `rejected_turns` and the scores,
    unpaired records `label`.
    """
    meta = run_prepared(con, rewrite[0], rewrite[1], raw)
    if not np.array_equal(numbers_of(meta.column(SOURCE_LINE), np.int64), numbers_of(raw.column(SOURCE_LINE), np.int64)):
        raise EtlBug("the pair rewrite changed the order of the chunk's records")
    parsed = {name: _parse_side(con, raw, meta, name, key, queries, run) for name, key in sides.items()}
    keep = [c for c in meta.column_names if not c.startswith(("line_", "route_"))]
    table = _sql(con, _combine(len(sides) == 2) + " order by source_line", meta=meta.select(keep), **parsed)
    unused = PAIR_ONLY if len(sides) == 1 else UNPAIRED_ONLY
    return table.drop_columns(list(unused))


def _side_queries(roles: Sequence[str], sides: dict[str, str], options: dict[str, Any], *, markers: Any, strip: bool,
                  template_tools: bool) -> dict[str, dict[str, BuilderQuery]]:
    """Route -> side -> the query that parses it: a side's own key read in place (a whole
    conversation, or a transcript string), or the rewrite's messages (prompt + completion)."""
    def chat(key: str) -> BuilderQuery:
        return conversation.chat_builder(roles=roles, messages_key=key, template_tools=template_tools,
                                         read_images=False, **options)

    def text(key: str) -> BuilderQuery:
        return transcript.transcript_builder(roles=roles, text_key=key, markers=markers, strip=strip,
                                             domain_key=options.get("domain_key"))

    queries = {LIST: dict.fromkeys(sides, chat(MESSAGES)), DIRECT: {n: chat(k) for n, k in sides.items()},
               TEXT_ROUTE: {n: text(k) for n, k in sides.items()}}
    # The record's size was checked before the rewrite, which adds the prompt once more.
    return {route: {n: dataclasses.replace(q, max_record_bytes=UNLIMITED) for n, q in by_side.items()}
            for route, by_side in queries.items()}


def _pair_query(*, roles: Sequence[str], sides: dict[str, str], prompt_key: str | None, label_key: str | None,
                score_keys: tuple[str | None, str | None], options: dict[str, Any], markers: Any, strip: bool,
                template_tools: bool) -> BuilderQuery:
    for option, key in [("prompt_key", prompt_key), *((f"{n}_key", k) for n, k in sides.items())]:
        check_key(option, key, optional=option == "prompt_key")
    queries = _side_queries(roles, sides, options, markers=markers, strip=strip, template_tools=template_tools)
    rewrite = _rewrite(sides=sides, prompt_key=prompt_key, label_key=label_key, score_keys=score_keys, roles=roles,
                       role_key=options["role_key"], content_key=options["content_key"])
    # The identity of the whole parse (the parsed-chunk cache keys on sql + params).
    parses = [q for by_side in queries.values() for q in by_side.values()]
    sql = "\n;\n".join([rewrite[0], *(q.sql for q in parses), _combine(len(sides) == 2)])
    params = {"rewrite": rewrite[1], "parses": [q.params for q in parses]}
    compose = partial(parse_pairs, rewrite=rewrite, sides=dict(sides), queries=queries)
    return BuilderQuery(sql=sql, params=json.loads(json.dumps(params, default=str)), compose=compose)


def preference_builder(
    *, roles: Sequence[str], prompt_key: str | None = "prompt", chosen_key: str = "chosen",
    rejected_key: str = "rejected", score_chosen_key: str | None = "score_chosen",
    score_rejected_key: str | None = "score_rejected", role_key: str = "role", content_key: str = "content",
    train_key: str | None = "train", weight_key: str | None = "weight", tool_calls_key: str | None = "tool_calls",
    role_map: Mapping[str, str] | None = None, system_key: str | None = None, tools_key: str | None = "tools",
    domain_key: str | None = None, markers: Mapping[str, str] | None = None, strip: bool = True,
    parse_think: bool = True, ignore_fields: Sequence[str] = (), template_tools: bool = False, **_: Any,
) -> BuilderQuery:
    """TRL's preference records: `prompt`, `chosen`, `rejected`, each a string or a message list.

    Without a `prompt` (the implicit form), `chosen` and `rejected` are whole conversations, as
    message lists or as transcript strings (hh-rlhf's `"\\n\\nHuman: ..."`; `markers` and `strip`
    as in `transcript`), and the prompt is the messages they share from the start. Scores
    (`score_chosen_key`, `score_rejected_key`) are carried through; message keys, `role_map`,
    `system_key`, `tools_key`, reasoning and tool calls are read as `chat` reads them.

    Reasons beyond `chat`'s (a side's own reason is named with `chosen: ` / `rejected: `):
    `missing_key`, `bad_type` (not a string or a list), `bad_score` (not a JSON number, or NaN /
    infinite), `chosen_equals_rejected`,
    `empty_completion`, `prompts_differ` (the implicit form's conversations differ before their
    last user turn), `completion_not_assistant`.
    """
    options = {"role_key": role_key, "content_key": content_key, "train_key": train_key, "weight_key": weight_key,
               "tool_calls_key": tool_calls_key, "role_map": role_map, "system_key": system_key,
               "tools_key": tools_key, "domain_key": domain_key, "parse_think": parse_think,
               "ignore_fields": list(ignore_fields)}
    return _pair_query(roles=roles, sides={"chosen": chosen_key, "rejected": rejected_key}, prompt_key=prompt_key,
                       label_key=None, score_keys=(score_chosen_key, score_rejected_key), options=options,
                       markers=markers, strip=strip, template_tools=template_tools)


def unpaired_builder(
    *, roles: Sequence[str], prompt_key: str | None = "prompt", completion_key: str = "completion",
    label_key: str = "label", markers: Mapping[str, str] | None = None, strip: bool = True,
    role_key: str = "role", content_key: str = "content", train_key: str | None = "train",
    weight_key: str | None = "weight", tool_calls_key: str | None = "tool_calls",
    role_map: Mapping[str, str] | None = None, system_key: str | None = None, tools_key: str | None = "tools",
    domain_key: str | None = None, parse_think: bool = True, ignore_fields: Sequence[str] = (),
    template_tools: bool = False, **_: Any,
) -> BuilderQuery:
    """TRL's unpaired (KTO) records: `prompt`, `completion` (each a string or a message list) and
    a bool `label` (desirable or not). Without a `prompt`, `completion` is a whole conversation (a
    message list, or a transcript string as hh-rlhf's) and its completion is what follows its last
    user turn: hh-rlhf's pairs become KTO rows as `{"completion": chosen, "label": true}` and
    `{"completion": rejected, "label": false}`. Reasons as `preference`'s, plus `label_not_bool`, and
    `no_user_turn` for a record with no prompt whose conversation has no user message (nothing
    marks where its completion starts)."""
    options = {"role_key": role_key, "content_key": content_key, "train_key": train_key, "weight_key": weight_key,
               "tool_calls_key": tool_calls_key, "role_map": role_map, "system_key": system_key,
               "tools_key": tools_key, "domain_key": domain_key, "parse_think": parse_think,
               "ignore_fields": list(ignore_fields)}
    return _pair_query(roles=roles, sides={"chosen": completion_key}, prompt_key=prompt_key, label_key=label_key,
                       score_keys=(None, None), options=options, markers=markers, strip=strip,
                       template_tools=template_tools)
