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
import pyarrow as pa
import pyarrow.compute as pc

from etl.columns import SOURCE_LINE
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
    is_text_or_list,
    kind_of_key,
    side_columns,
)
from etl.formats.prepared import run_prepared

# The keys a side's rewritten line holds its conversation under: not options, never user keys.
MESSAGES = "__etl_messages"
TEXT = "__etl_text"
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
    # An unpaired record needs its prompt; a pair without one is the implicit form.
    required = {"prompt": prompt_key, **sides, "label": label_key} if label_key is not None else dict(sides)
    slot_of = {"prompt_key": "p", "label_key": "lab", "score_chosen_key": "sc", "score_rejected_key": "sr",
               **{f"{name}_key": f"s_{name}" for name in sides}}
    sql = REWRITE.format(
        records=records_cte(named).strip(), head=HEAD_REASONS, head_details=HEAD_DETAILS,
        absent_sides="".join(absent(slot_of[f"{k}_key"], f"{k}_key") for k in required),
        prompt_ok=is_text_or_list("p"),
        bad_sides=" ".join(f"when not {is_text_or_list(f's_{n}')} then 'bad_type:' || ${n}_key" for n in sides),
        label_check="" if label_key is None else "when lab::varchar not in ('true', 'false') then 'label_not_bool'",
        kind_of_key=kind_of_key(slot_of), kind_label=kind("lab"),
        missing=with_record_keys("'no \"' || pre_key || '\" key (or it is null)'"),
        sides=",\n    ".join(side_columns(name, f"s_{name}") for name in sides),
    )
    params = base_params(structure=top.structure(), roles=roles) | {
        "msgs": MESSAGES, "text": TEXT, "role_key": role_key, "content_key": content_key,
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


def _parse_side(con: duckdb.DuckDBPyConnection, meta: pa.Table, name: str, key: str,
                queries: tuple[BuilderQuery, BuilderQuery], run: Any) -> pa.Table:
    """One side's conversations, parsed by the chat or the transcript builder as its route says;
    details name the record's key, not the rewrite's."""
    lines = meta.select([SOURCE_LINE, f"line_{name}"]).rename_columns([SOURCE_LINE, "line"])
    is_text = pc.equal(meta.column(f"route_{name}"), "text")
    lists, texts = run(con, lines.filter(pc.invert(is_text)), queries[0]), run(con, lines.filter(is_text), queries[1])
    side = _sql(con, SIDE, lists=lists, texts=texts)
    detail = side.column("detail")
    for internal in (MESSAGES, TEXT):
        detail = pc.replace_substring(detail, internal, key)
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
                sides: dict[str, str], queries: tuple[BuilderQuery, BuilderQuery]) -> pa.Table:
    """The pair table of one raw chunk: `run` (`run_builder`) parses each side's conversation.

    Columns: the builders' `source_line, reason, detail, raw, messages, domain, tools`, with
    `messages` the chosen (or the unpaired) conversation, and `completion_turns` (its last
    messages that are the completion); pairs add `rejected`, `rejected_turns` and the scores,
    unpaired records `label`.
    """
    meta = run_prepared(con, rewrite[0], rewrite[1], raw)
    parsed = {name: _parse_side(con, meta, name, key, queries, run) for name, key in sides.items()}
    keep = [c for c in meta.column_names if not c.startswith(("line_", "route_"))]
    table = _sql(con, _combine(len(sides) == 2) + " order by source_line", meta=meta.select(keep), **parsed)
    unused = PAIR_ONLY if len(sides) == 1 else UNPAIRED_ONLY
    return table.drop_columns(list(unused))


def _side_queries(roles: Sequence[str], options: dict[str, Any], *, markers: Any, strip: bool,
                  template_tools: bool) -> tuple[BuilderQuery, BuilderQuery]:
    chat = conversation.chat_builder(roles=roles, messages_key=MESSAGES, template_tools=template_tools, **options)
    text = transcript.transcript_builder(roles=roles, text_key=TEXT, markers=markers, strip=strip,
                                         domain_key=options.get("domain_key"))
    # The record's size was checked before the rewrite, which adds the prompt once more.
    return dataclasses.replace(chat, max_record_bytes=UNLIMITED), dataclasses.replace(text, max_record_bytes=UNLIMITED)


def _pair_query(*, roles: Sequence[str], sides: dict[str, str], prompt_key: str | None, label_key: str | None,
                score_keys: tuple[str | None, str | None], options: dict[str, Any], markers: Any, strip: bool,
                template_tools: bool) -> BuilderQuery:
    for option, key in [("prompt_key", prompt_key), *((f"{n}_key", k) for n, k in sides.items())]:
        check_key(option, key, optional=option == "prompt_key" and label_key is None)
    queries = _side_queries(roles, options, markers=markers, strip=strip, template_tools=template_tools)
    rewrite = _rewrite(sides=sides, prompt_key=prompt_key, label_key=label_key, score_keys=score_keys, roles=roles,
                       role_key=options["role_key"], content_key=options["content_key"])
    # The identity of the whole parse (the parsed-chunk cache keys on sql + params).
    sql = "\n;\n".join([rewrite[0], queries[0].sql, queries[1].sql, _combine(len(sides) == 2)])
    params = {"rewrite": rewrite[1], "chat": queries[0].params, "text": queries[1].params}
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
    `missing_key`, `bad_type` (not a string or a list), `bad_score`, `chosen_equals_rejected`,
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
    *, roles: Sequence[str], prompt_key: str = "prompt", completion_key: str = "completion", label_key: str = "label",
    role_key: str = "role", content_key: str = "content", train_key: str | None = "train",
    weight_key: str | None = "weight", tool_calls_key: str | None = "tool_calls",
    role_map: Mapping[str, str] | None = None, system_key: str | None = None, tools_key: str | None = "tools",
    domain_key: str | None = None, parse_think: bool = True, ignore_fields: Sequence[str] = (),
    template_tools: bool = False, **_: Any,
) -> BuilderQuery:
    """TRL's unpaired (KTO) records: `prompt`, `completion` (each a string or a message list) and
    a bool `label` (desirable or not). Reasons as `preference`'s, plus `label_not_bool`."""
    options = {"role_key": role_key, "content_key": content_key, "train_key": train_key, "weight_key": weight_key,
               "tool_calls_key": tool_calls_key, "role_map": role_map, "system_key": system_key,
               "tools_key": tools_key, "domain_key": domain_key, "parse_think": parse_think,
               "ignore_fields": list(ignore_fields)}
    return _pair_query(roles=roles, sides={"chosen": completion_key}, prompt_key=prompt_key, label_key=label_key,
                       score_keys=(None, None), options=options, markers=None, strip=True,
                       template_tools=template_tools)
