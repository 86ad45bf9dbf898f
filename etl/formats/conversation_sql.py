"""The SQL of the conversation builders (`chat`, `sharegpt`), kept apart from their options.

`QUERY` follows the `records`/`fields` CTEs of `etl.formats.base.records_cte`; its `{...}`
holes are filled by `etl.formats.conversation` with positional struct accessors and shared
fragments, never with user values (those are `$` parameters).
"""

from __future__ import annotations

from etl.formats.base import is_string

# `ps`: one analysed struct per message. `m` keeps the raw JSON text of the message's fields;
# content parts are parsed (a second, small json_transform) only for list content.
# `errs`: per message the first problem (NULL when fine), in the order the CASE lists them.
QUERY = """
parsed as (
    select
        *,
        list_transform(msgs, lambda x: struct_pack(
            m := struct_pack(role := {role}, content := {content}, train := {train},
                             weight := {weight}, calls := {calls}),
            role := coalesce($map_to[list_position($map_from, {role} ->> '$')], {role} ->> '$'),
            parts := case when starts_with({content}, '[') then json_transform({content}, $parts) end,
            train := case {train} when 'true' then true when 'false' then false end,
            weight := try_cast({weight}::varchar as double)
        )) as ps
    from fields
),
checked as (
    select
        *,
        list_transform(ps, lambda p: case
            when coalesce(p.m.role, p.m.content, p.m.train, p.m.weight, p.m.calls) is null
                then 'message_not_an_object'
            when not {role_is_string} then 'bad_role'
            when not list_contains($roles, p.role) then 'unknown_role'
            when p.m.calls is not null and not starts_with(p.m.calls, '[') then 'bad_tool_calls'
            when p.m.content is null and coalesce(p.m.calls, '[]') = '[]' then 'bad_content'
            when not (starts_with(p.m.content, '"') or starts_with(p.m.content, '[')) then 'bad_content'
            when p.m.content = '[]' then 'empty_content'
            else coalesce(
                list_filter(list_transform(p.parts, lambda q: {part_error}), lambda e: e is not null)[1],
                case
                    when p.m.train is not null and p.train is null then 'bad_train'
                    when p.m.weight is not null and not coalesce(p.weight >= 0 and isfinite(p.weight), false)
                        then 'bad_weight'
                end)
        end) as errs,
        list_position(list_transform(errs, lambda e: e is null), false) as err_at,
        case when errs[err_at] in ('bad_content_part', 'unsupported_content') then list_position(
            list_transform(ps[err_at].parts, lambda q: ({part_error}) is not null), true) end as part_at,
        case when {sys_is_string} and sys <> '""' then sys ->> '$' end as sys_text,
        -- An empty tool list is no tools, whether it is JSON ([]) or a JSON string of JSON
        -- ("[]", as glaive stores it): decode a string first, then compare the trimmed text.
        case when starts_with(tools, '"') then trim(tools ->> '$') else tools::varchar end as tools_raw,
        case when tools_raw is null or tools_raw in ('', '[]', '{{}}') then null
            else $tools_prefix || tools_raw end as tools_text,
        coalesce(ps[1].role = 'system', false) as has_system,
        not has_system and coalesce(sys_text, tools_text) is not null as add_system
    from parsed
),
built as (
    select
        *,
        list_transform(ps, lambda p: struct_pack(
            role := p.role,
            content := case
                when coalesce(p.m.calls, '[]') <> '[]' then concat_ws({nl}, nullif({text}, ''), p.m.calls::varchar)
                when p.parts is null then p.m.content ->> '$'
                when len(p.parts) = 1 then coalesce(p.parts[1].text, p.parts[1].value) ->> '$'
                else {text} end,
            train := p.train,
            weight := p.weight
        )::{message}) as base
    from checked
),
final as (
    select
        source_line,
        case {head}
            {absent_msgs}
            when len(msgs) = 0 then 'empty_messages'
            when sys is not null and not {sys_is_string} then 'not_a_string'
            when tools is not null and not (starts_with(tools, '"') or starts_with(tools, '[')
                or starts_with(tools, '{{')) then 'bad_tools'
            when err_at is not null then errs[err_at]
            when add_system and not list_contains($roles, 'system') then 'unknown_role'
        end as reason,
        case reason {head_details}
            when 'missing_key' then {missing_msgs}
            when 'not_a_list' then '"' || $messages_key || '" is '
                || {msgs_type} || ', not a list of messages'
            when 'empty_messages' then '"' || $messages_key || '" is an empty list'
            when 'not_a_string' then '"' || $system_key || '" is ' || {sys_kind} || ', not a string'
            when 'bad_tools' then '"' || $tools_key || '" is ' || {tools_kind}
                || '; expected a JSON string, list or object'
            else 'message ' || (err_at - 1) || ' ' || case reason
                when 'message_not_an_object' then 'is '
                    || {msg_type} || ', not an object with "' || $role_key || '" and "' || $content_key || '"'
                when 'bad_role' then '"' || $role_key || '" is ' || {kind_role} || ', not a string'
                when 'unknown_role' then 'has role "' || (ps[err_at].m.role ->> '$') || '"'
                    || case when ps[err_at].role <> (ps[err_at].m.role ->> '$')
                        then ' (mapped to "' || ps[err_at].role || '")' else '' end
                    || '; expected one of ' || array_to_string($roles, ', ')
                    || case when ps[err_at].role = (ps[err_at].m.role ->> '$') and len($map_from) > 0
                        then ' or a role_map key (' || array_to_string($map_from, ', ') || ')' else '' end
                when 'bad_tool_calls' then '"' || $tool_calls_key || '" is ' || {kind_calls} || ', not a list'
                when 'bad_content' then case
                    when ps[err_at].m.content is null then 'has no "' || $content_key || '"'
                        || case when $tool_calls_key <> '' then ' and no "' || $tool_calls_key || '"' else '' end
                    else '"' || $content_key || '" is ' || {kind_content} || ', not a string or a list of parts'
                    end
                when 'empty_content' then '"' || $content_key || '" is an empty list of parts'
                when 'bad_train' then '"' || $train_key || '" is ' || left(ps[err_at].m.train, 40)
                    || '; expected true or false'
                when 'bad_weight' then '"' || $weight_key || '" is ' || left(ps[err_at].m.weight, 40)
                    || '; expected a number >= 0'
                else {part_detail}
            end
        end as detail,
        case when reason is null then case
            when add_system then [struct_pack(role := 'system', content := concat_ws({nl} || {nl}, sys_text, tools_text),
                                              train := null::boolean, weight := null::double)::{message}] || base
            when tools_text is not null then [struct_pack(role := 'system',
                content := concat_ws({nl} || {nl}, nullif(base[1].content, ''), tools_text),
                train := base[1].train, weight := base[1].weight)::{message}] || base[2:]
            else base end
        end as messages,
        dom ->> '$' as domain,
        case when reason is not null then left(line, $preview) end as raw
    from built
)
select source_line, reason, detail, raw, messages, domain from final"""

# A message's text: the string content, or its text parts joined (a single part is the common
# case and skips the join, ~40% of this step on LLaMA-Factory v1 data).
TEXT = """(case when p.parts is null then p.m.content ->> '$'
    else array_to_string(list_transform(p.parts, lambda q: coalesce(q.text, q.value) ->> '$'), $sep) end)"""

# Per content part: the first problem, NULL for a usable text part.
PART_ERROR = """case
    when q is null or coalesce(q.type, q.text, q.value) is null or not {type_is_string} then 'bad_content_part'
    when not list_contains($part_types, q.type ->> '$') then 'unsupported_content'
    when not {text_is_string} then 'bad_content_part'
end""".format(type_is_string=is_string("q.type"), text_is_string=is_string("coalesce(q.text, q.value)"))

PART_DETAIL = """'content part ' || (part_at - 1) || case
    when errs[err_at] = 'unsupported_content' then ' has type "' || (ps[err_at].parts[part_at].type ->> '$')
        || '"; supported part types: ' || array_to_string($part_types, ', ')
    when not {type_is_string} then ' is not an object with a string "type"'
    else ' of type "' || (ps[err_at].parts[part_at].type ->> '$') || '" has no string "text" or "value"'
end""".format(type_is_string=is_string("ps[err_at].parts[part_at].type"))
