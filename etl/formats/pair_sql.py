"""The SQL of the `preference` and `unpaired` input types (`etl.formats.preference` runs it).

`REWRITE` reads each raw record once: the pair's own checks (keys present, types, scores, the
label), and for every side (chosen, rejected; or completion) the line that side's conversation
is parsed from when the record has a prompt: the record with `$msgs` set to the prompt's
messages followed by the side's (strings become a user / an assistant message). Without a
prompt the side's own key is parsed in place (a message list, or hh-rlhf's transcript string). `COMBINE` joins the sides' parsed conversations, finds
the prompt and applies the pair's rejects.
"""

from __future__ import annotations

from etl.formats.base import CHAT_MESSAGE_TYPE, kind

# A prompt's messages as a JSON list: none, the list, or one user message holding a string.
PROMPT_LIST = """(case when p is null then []::json[]
        when starts_with(p, '[') then json_extract(p, '$[*]')
        else [json_object($role_key, 'user', $content_key, p ->> '$')] end)"""


def side_line(slot: str) -> str:
    """SQL for the line a side's conversation is parsed from (the record itself once rejected)."""
    return f"""(case when pre_reason is not null or p is null then null
        when starts_with({slot}, '[') then json_merge_patch(line, json_object($msgs,
            to_json(list_concat({PROMPT_LIST}, json_extract({slot}, '$[*]')))))::varchar
        else json_merge_patch(line, json_object($msgs, to_json(list_concat({PROMPT_LIST},
            [json_object($role_key, 'assistant', $content_key, {slot} ->> '$')]))))::varchar end)"""


def side_columns(name: str, slot: str) -> str:
    """A side's rewritten line, its route (`list`: the chat parse, `text`: the transcript parse)
    and its number of messages (those at the end of the parsed conversation)."""
    return f"""{side_line(slot)} as line_{name},
        case when pre_reason is not null then 'direct' when p is not null then 'list'
            when starts_with({slot}, '"') then 'text' else 'direct' end as route_{name},
        case when starts_with({slot}, '[') then json_array_length({slot}) else 1 end::integer as n_{name}"""


def is_text_or_list(slot: str) -> str:
    return f"(starts_with({slot}, '[') or starts_with({slot}, '\"'))"


def absent(slot: str, key: str) -> str:
    """A WHEN clause: a required key that is absent or null is `missing_key` (or the record is no object)."""
    return f"""
            when {slot} is null then case when json_type(line) <> 'OBJECT' then 'not_an_object'
                else 'missing_key:' || ${key} end"""


REWRITE = """with {records},
checked as (
    select *,
        case {head} {absent_sides}
            when p is not null and not {prompt_ok} then 'bad_type:' || $prompt_key
            {bad_sides}
            {label_check}
            when sc is not null and not {finite_sc} then 'bad_score:' || $score_chosen_key
            when sr is not null and not {finite_sr} then 'bad_score:' || $score_rejected_key
        end as pre
    from fields
),
reasons as (
    select *, case when strpos(pre, ':') > 0 then left(pre, strpos(pre, ':') - 1) else pre end as pre_reason,
        case when strpos(pre, ':') > 0 then substr(pre, strpos(pre, ':') + 1) end as pre_key
    from checked
)
select source_line,
    pre_reason,
    case pre_reason {head_details}
        when 'missing_key' then {missing}
        when 'bad_type' then '"' || pre_key || '" is ' || {kind_of_key} || ', not a string or a list of messages'
        when 'bad_score' then '"' || pre_key || '" is ' || replace({kind_of_key}, 'a number', 'NaN or infinite')
            || ', not a finite number'
        when 'label_not_bool' then '"' || $label_key || '" is ' || {kind_label} || ', not true or false'
    end as pre_detail,
    left(line, $preview) as raw,
    p is not null as has_prompt,
    try_cast(sc as double) as score_chosen,
    try_cast(sr as double) as score_rejected,
    lab = 'true' as label,
    {sides}
from reasons"""


def finite_number(slot: str) -> str:
    """SQL: the JSON value is a number (not `"9"` or `true`, which a cast to double would take)
    and finite (a NaN, `Infinity` or 1e999 in the input would be written as such)."""
    return f"({kind(slot)} = 'a number' and coalesce(isfinite(try_cast({slot} as double)), false))"


def kind_of_key(slots: dict[str, str]) -> str:
    """SQL naming the type of the field `pre_key` names (the slot read for that key)."""
    whens = " ".join(f"when pre_key = ${param} then {kind(slot)}" for param, slot in slots.items())
    return f"(case {whens} end)"


# One side's parse per route, as the union of its routes' tables: `{table}` each; a transcript's
# messages gain the chat message's fields.
SIDE = {
    "list": "select source_line, reason, detail, messages, domain, tools from {table}",
    "direct": "select source_line, reason, detail, messages, domain, tools from {table}",
    "text": f"""select source_line, reason, detail,
    list_transform(messages, lambda m: struct_pack(role := m.role, content := m.content, train := m.train,
        weight := m.weight, reasoning := null::varchar, calls := null::varchar[],
        image_at := null::integer[])::{CHAT_MESSAGE_TYPE}) as messages,
    domain, null::varchar as tools from {{table}}""",
}

# `k`: the messages both sides share from the start (the prompt, found as TRL's extract_prompt
# does when the record has none); `nc`/`nr`: the completion's messages on each side.
COMBINE = """with joined as (
    select m.source_line, m.pre_reason, m.pre_detail, m.raw, m.has_prompt, m.score_chosen, m.score_rejected,
        m.label, m.n_chosen, {n_rejected} as n_rejected,
        c.reason as c_reason, c.detail as c_detail, c.messages as cm, c.domain, c.tools,
        {rejected_side} as r_reason, {rejected_detail} as r_detail, {rejected_messages} as rm
    from {{meta}} m join {{chosen}} c using (source_line) {join_rejected}
),
counted as (
    select *,
        coalesce(list_position(list_transform(range(1, least(len(cm), len(rm)) + 1),
            lambda i: cm[i] is not distinct from rm[i]), false) - 1, least(len(cm), len(rm))) as shared,
        case when has_prompt then n_chosen when {paired} then len(cm) - shared
            else coalesce(list_position(list_reverse(list_transform(cm, lambda m: m.role)), 'user') - 1, 0)
            end as nc,
        case when has_prompt then n_rejected else len(rm) - shared end as nr
    from joined
),
judged as (
    select *,
        cm[len(cm) - nc + 1:] as c_done, rm[len(rm) - nr + 1:] as r_done,
        case when pre_reason is not null then pre_reason
            when c_reason is not null then c_reason
            when r_reason is not null then r_reason
            when {paired} and cm is not distinct from rm then 'chosen_equals_rejected'
            when not {paired} and not has_prompt
                and not list_contains(list_transform(cm, lambda m: m.role), 'user') then 'no_user_turn'
            when nc <= 0 or {paired} and nr <= 0 then 'empty_completion'
            when not has_prompt and (list_contains(list_transform(c_done, lambda m: m.role), 'user')
                or list_contains(list_transform(r_done, lambda m: m.role), 'user')) then 'prompts_differ'
            when c_done[1].role <> 'assistant' or {paired} and r_done[1].role <> 'assistant'
                then 'completion_not_assistant'
            when {blank_c} or {paired} and {blank_r} then 'empty_completion'
        end as reason
    from counted
)
select source_line, reason,
    case when reason = pre_reason then pre_detail
        when reason = c_reason then '{first}: ' || c_detail
        when reason = r_reason then 'rejected: ' || r_detail
        when reason = 'chosen_equals_rejected' then 'the chosen and rejected conversations are the same'
        when reason = 'empty_completion' then 'a completion has no message with text'
        when reason = 'no_user_turn' then 'no prompt and no user message: without a prompt the completion is '
            || 'what follows the last user turn; give the record a prompt or a user message'
        when reason = 'prompts_differ' then 'chosen and rejected differ before their last user turn (message '
            || shared || '), so they share no prompt'
        when reason = 'completion_not_assistant' then 'a completion starts with a "' ||
            case when c_done[1].role <> 'assistant' then c_done[1].role else r_done[1].role end
            || '" message, not an assistant one'
    end as detail,
    case when reason is not null then raw end as raw,
    case when reason is null then cm end as messages,
    case when reason is null then rm end as rejected,
    nc::integer as completion_turns, nr::integer as rejected_turns,
    score_chosen, score_rejected, label, domain, tools
from judged"""



def blank(messages: str) -> str:
    """SQL: every message of a completion is empty (no text, no reasoning, no tool call)."""
    return f"""list_bool_and(list_transform({messages}, lambda m: coalesce(m.content, '') = ''
        and coalesce(m.reasoning, '') = '' and coalesce(len(m.calls), 0) = 0))"""
