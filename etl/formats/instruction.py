"""Single-turn builders: `instruction` (prompt/response and alpaca) and `prompt_completion`.

Both make `[system?] + history + [user, assistant]` from top-level string fields. The alpaca
fields are fallbacks of the prompt/response fields, so a config that names
`prompt_key: "instruction", response_key: "output"` still appends a non-empty `input`.
`instruction` reads LLaMA-Factory's images: placeholders in the text and a top-level image list.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from etl.errors import EtlError
from etl.formats.base import (
    HEAD_DETAILS,
    HEAD_REASONS,
    MESSAGE_TYPE,
    BuilderQuery,
    Slots,
    base_params,
    check_key,
    is_string,
    kind,
    records_cte,
    require_roles,
    with_record_keys,
)
from etl.formats.conversation import IMAGE_PLACEHOLDER

# MESSAGE_TYPE with where each message's images go: character offsets into its content, as the
# conversation builders' `image_at` (etl.formats.base.CHAT_MESSAGE_TYPE). The pipeline reads the
# offsets where the field exists and reasoning or calls only where theirs do, so a plain-text
# builder adds this field alone: its text-only messages stay what they were.
IMAGE_MESSAGE_TYPE = MESSAGE_TYPE.removesuffix(")") + ", image_at integer[])"
_REJECT = "image_count_mismatch"  # reason and detail as the conversation builders' (conversation_sql)


def _top_images(slot: str) -> str:
    """SQL: the record's image list (`slot`, JSON text) as each image's JSON text; one value that is
    not a list is a list of one (LLaVA's `image`); NULL without the key (then no placeholder counts)."""
    return f"""(case when {slot} is null then null
        when starts_with({slot}, '[') then json_transform({slot}, '["JSON"]')::varchar[]
        else [{slot}::varchar] end)"""


def _placeholder_at(text: str) -> str:
    """SQL: each `$placeholder`'s character offset in `text` once the placeholders are taken out."""
    return f"""list_transform(range(1, len(string_split({text}, $placeholder))),
        lambda i: length(array_to_string(string_split({text}, $placeholder)[1:i], ''))::integer)"""


def _count(text: str) -> str:
    """SQL: how many times `$placeholder` is in `text` (as often as `_placeholder_at` places one)."""
    return f"coalesce((length({text}) - length(replace({text}, $placeholder, ''))) // length($placeholder), 0)"


def _with_image_at(messages: str) -> str:
    """SQL: `messages` (IMAGE_MESSAGE_TYPE[]) with their placeholders taken out of the content and
    their offsets in `image_at`; an empty placeholder places nothing (it would split every character)."""
    return f"""list_transform({messages}, lambda m: struct_pack(role := m.role,
        content := case when $placeholder = '' then m.content else replace(m.content, $placeholder, '') end,
        train := m.train, weight := m.weight,
        image_at := case when $placeholder = '' then []::integer[] else {_placeholder_at("m.content")} end
        )::{IMAGE_MESSAGE_TYPE})"""


def _mismatch_detail(count: str, images: str) -> str:
    """SQL: the `_REJECT` detail, in the conversation builders' words (etl.formats.conversation_sql)."""
    return f"""({count} || ' image placeholder(s) ' || $placeholder || ' but "' || $images_key || '" holds '
        || coalesce(len({images}), 0) || ' image(s)')"""


def _message(role: str, content: str) -> str:
    return (f"struct_pack(role := {role}, content := {content}, train := null::boolean, "
            f"weight := null::double, image_at := null::integer[])::{IMAGE_MESSAGE_TYPE}")


# The user's text: the prompt, then the alpaca input (an empty one is left out).
USER_TEXT = "concat_ws($input_sep, nullif(p ->> '$', ''), nullif(input ->> '$', ''))"
# The messages of a good record: [system?] + history pairs + [user, assistant].
MESSAGES = f"""(case when sys_text is null then []::{IMAGE_MESSAGE_TYPE}[] else [{_message("'system'", "sys_text")}] end
    || coalesce(flatten(list_transform(pairs, lambda h: [
        {_message("'user'", "h[1] ->> '$'")}, {_message("'assistant'", "h[2] ->> '$'")}])), [])
    || [{_message("'user'", USER_TEXT)}, {_message("'assistant'", "response")}])"""
# The placeholders in those messages' texts, with a top-level image list (NULL without one).
PLACEHOLDERS = f"""case when top_images is not null and $placeholder <> '' then {_count("sys_text")} + {_count(USER_TEXT)}
    + {_count("response")} + coalesce(list_sum(list_transform(pairs,
        lambda h: {_count("(h[1] ->> '$')")} + {_count("(h[2] ->> '$')")})), 0) end"""

# `p`/`r`: the prompt and response JSON, from the prompt/response key or its alpaca fallback.
# `pairs`: the history parsed (a second, small json_transform) only when it is a list.
QUERY = f"""
checked as (
    select
        *,
        coalesce(prompt, instr) as p,
        case when prompt is not null then $prompt_key else $instruction_key end as p_key,
        coalesce(resp, outp) as r,
        case when resp is not null then $response_key else $output_key end as r_key,
        case when starts_with(hist, '[') then json_transform(hist, $pairs) end as pairs,
        list_position(list_transform(pairs, lambda h: coalesce(
            len(h) = 2 and {is_string("h[1]")} and {is_string("h[2]")}, false)), false) as bad_pair,
        case when {is_string("sys")} and sys <> '""' then sys ->> '$' end as sys_text,
        {_top_images("imgs")} as top_images
    from fields
),
final as (
    select
        source_line,
        case {HEAD_REASONS}
            when p is null then case when json_type(line) <> 'OBJECT' then 'not_an_object' else 'missing_key' end
            when r is null then 'missing_key'
            when not {is_string("p")} or not {is_string("r")} then 'not_a_string'
            when input is not null and not {is_string("input")} then 'not_a_string'
            when sys is not null and not {is_string("sys")} then 'not_a_string'
            when hist is not null and (pairs is null or bad_pair is not null) then 'bad_history'
            when sys_text is not null and not list_contains($roles, 'system') then 'unknown_role'
            when top_images is not null and coalesce(placeholders, 0) <> len(top_images) then '{_REJECT}'
        end as reason,
        case reason {HEAD_DETAILS}
            when 'missing_key' then {with_record_keys("case when p is null then $no_prompt else $no_response end")}
            when 'not_a_string' then case
                when not {is_string("p")} then '"' || p_key || '" is ' || {kind("p")}
                when not {is_string("r")} then '"' || r_key || '" is ' || {kind("r")}
                when input is not null and not {is_string("input")} then '"' || $input_key || '" is ' || {kind("input")}
                else '"' || $system_key || '" is ' || {kind("sys")}
                end || ', not a string'
            when 'bad_history' then case
                when pairs is null then '"' || $history_key || '" is ' || {kind("hist")}
                    || ', not a list of [user, assistant] pairs'
                else '"' || $history_key || '" item ' || (bad_pair - 1)
                    || ' is not a [user, assistant] pair of strings'
                end
            when 'unknown_role' then 'the record has a system prompt but the template has no system role; '
                || 'expected one of ' || array_to_string($roles, ', ')
            when '{_REJECT}' then {_mismatch_detail("coalesce(placeholders, 0)", "top_images")}
        end as detail,
        -- Images (etl.images): with a top-level image list each placeholder in a message's text is the
        -- next image; without one, text that spells the placeholder is text. Only such records pay for it.
        -- (one flat CASE: a nested one cost ~8% of the parse, measured on T0 as alpaca records)
        case when reason is null and top_images is null then {MESSAGES}
            when reason is null then {_with_image_at(MESSAGES)} end as messages,
        dom ->> '$' as domain,
        case when reason is null and placeholders > 0 then top_images end as images,
        case when reason is not null then left(line, $preview) end as raw
    from (select *, r ->> '$' as r_text, case when $suffix <> '' and ends_with(r_text, $suffix)
            then left(r_text, length(r_text) - length($suffix)) else r_text end as response,
            {PLACEHOLDERS} as placeholders from checked)
)
select source_line, reason, detail, raw, messages, domain, images from final"""


def _no_key(key: str, fallback: str | None) -> str:
    keys = f'"{key}"' if fallback in (None, key) else f'"{key}" or "{fallback}"'
    return f"no {keys} key (or it is null)"


def _check_groups(**groups: tuple[str | None, ...]) -> None:
    """One key may serve a field and its alpaca fallback, never two different fields."""
    owner: dict[str, str] = {}
    for field, keys in groups.items():
        for key in filter(None, keys):
            if owner.setdefault(key, field) != field:
                raise EtlError(f"input: key {key!r} is configured for both {owner[key]} and {field}; they must differ")


def _single_turn_query(
    *,
    roles: Sequence[str],
    input_type: str,
    prompt_key: str,
    response_key: str,
    instruction_key: str | None = None,
    input_key: str | None = None,
    output_key: str | None = None,
    system_key: str | None = None,
    history_key: str | None = None,
    input_separator: str = "\n\n",
    strip_suffix: str | None = None,
    domain_key: str | None = None,
    images_key: str | None = None,
    image_placeholder: str = IMAGE_PLACEHOLDER,
) -> BuilderQuery:
    """The shared query of `instruction` and `prompt_completion`; keys are bound parameters."""
    check_key("prompt_key", prompt_key)
    check_key("response_key", response_key)
    for option, key in (("instruction_key", instruction_key), ("input_key", input_key),
                        ("output_key", output_key), ("system_key", system_key),
                        ("history_key", history_key), ("domain_key", domain_key), ("images_key", images_key)):
        check_key(option, key, optional=True)
    _check_groups(prompt=(prompt_key, instruction_key), response=(response_key, output_key),
                  input=(input_key,), system=(system_key,), history=(history_key,), images=(images_key,))
    for option, value in (("input_separator", input_separator), ("image_placeholder", image_placeholder)):
        if not isinstance(value, str):
            raise EtlError(f"input.{option} is {value!r}; expected a string")
    if strip_suffix is not None and not isinstance(strip_suffix, str):
        raise EtlError(f"input.strip_suffix is {strip_suffix!r}; expected a string or null")
    require_roles(("user", "assistant"), roles, input_type)
    top = Slots("rec")
    slots = {
        "prompt": top.slot(prompt_key), "instr": top.slot(instruction_key), "input": top.slot(input_key),
        "resp": top.slot(response_key), "outp": top.slot(output_key), "sys": top.slot(system_key),
        "hist": top.slot(history_key), "dom": top.slot(domain_key), "imgs": top.slot(images_key),
    }
    params = base_params(structure=top.structure(), roles=roles) | {
        "pairs": json.dumps([["JSON"]]),
        "prompt_key": prompt_key, "instruction_key": instruction_key or prompt_key,
        "response_key": response_key, "output_key": output_key or response_key,
        "input_key": input_key or "", "system_key": system_key or "", "history_key": history_key or "",
        "no_prompt": _no_key(prompt_key, instruction_key), "no_response": _no_key(response_key, output_key),
        "input_sep": input_separator, "suffix": strip_suffix or "",
        "placeholder": image_placeholder, "images_key": images_key or "",
    }
    return BuilderQuery(sql="with" + records_cte(slots) + "," + QUERY, params=params)


def instruction_builder(
    *,
    roles: Sequence[str],
    prompt_key: str = "prompt",
    response_key: str = "response",
    instruction_key: str | None = "instruction",
    input_key: str | None = "input",
    output_key: str | None = "output",
    system_key: str | None = "system",
    history_key: str | None = "history",
    input_separator: str = "\n\n",
    strip_suffix: str | None = None,
    domain_key: str | None = None,
    images_key: str | None = "images",
    image_placeholder: str = IMAGE_PLACEHOLDER,
    **_: Any,
) -> BuilderQuery:
    """Instruction records: prompt/response or alpaca instruction/input/output.

    user = the `prompt_key` string, or else the `instruction_key` string, and the `input_key`
    string, joined by `input_separator` (an empty one is left out); assistant = the
    `response_key` string, or else the `output_key` string (minus `strip_suffix`). A non-empty
    `system_key` string becomes a leading system message; `history_key` (alpaca /
    LLaMA-Factory) is a list of [user, assistant] string pairs inserted as earlier turns.
    Set an alpaca key to null to ignore that field.

    Images (LLaMA-Factory's layout): with a top-level `images_key` list (one value that is not a
    list is one image, LLaVA's `image`), each `image_placeholder` in any message's text is the next
    image of the list, in message order; a count that differs from the list's rejects the record as
    `image_count_mismatch`. Without the key, text that spells the placeholder is text.
    """
    return _single_turn_query(
        roles=roles, input_type="instruction", prompt_key=prompt_key, response_key=response_key,
        instruction_key=instruction_key, input_key=input_key, output_key=output_key,
        system_key=system_key, history_key=history_key, input_separator=input_separator,
        strip_suffix=strip_suffix, domain_key=domain_key, images_key=images_key,
        image_placeholder=image_placeholder,
    )


def prompt_completion_builder(
    *,
    roles: Sequence[str],
    prompt_key: str = "prompt",
    completion_key: str = "completion",
    strip_suffix: str | None = None,
    system_key: str | None = None,
    domain_key: str | None = None,
    **_: Any,
) -> BuilderQuery:
    """`{"prompt", "completion"}` records (OpenAI legacy fine-tuning, TRL) as user/assistant.

    `strip_suffix` removes one trailing occurrence of a literal string from the completion:
    T0 / GPT-3 fine-tuning data ends every completion with `<|endoftext|>`, which must not be
    trained as text (the template adds its own end-of-turn). Default: keep the text as is.
    """
    return _single_turn_query(
        roles=roles, input_type="prompt_completion", prompt_key=prompt_key, response_key=completion_key,
        system_key=system_key, strip_suffix=strip_suffix, domain_key=domain_key,
    )
