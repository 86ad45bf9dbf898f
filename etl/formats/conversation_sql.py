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
                             weight := {weight}, calls := {calls}, reasoning := {reasoning}),
            source_role := {role} ->> '$',
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
            when coalesce(p.m.role, p.m.content, p.m.train, p.m.weight, p.m.calls, p.m.reasoning) is null
                then 'message_not_an_object'
            when not {role_is_string} then 'bad_role'
            when not list_contains($roles, p.role) then 'unknown_role'
            when p.m.calls is not null and not starts_with(p.m.calls, '[') then 'bad_tool_calls'
            when p.m.reasoning is not null and not {reasoning_is_string} then 'bad_reasoning'
            when p.m.content is null and coalesce(p.m.calls, '[]') = '[]' then 'bad_content'
            when p.m.content is not null and not (starts_with(p.m.content, '"') or starts_with(p.m.content, '['))
                then 'bad_content'
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
        case when tools_raw is null or tools_raw in ('', '[]', '{{}}') then null else tools_raw end as tools_raw_kept,
        -- Templates that render tools themselves get them as the `tools` column; others read
        -- them as text in the system message.
        case when not $template_tools and tools_raw_kept is not null then $tools_prefix || tools_raw_kept end as tools_text,
        -- Images (etl.images): parts of an image type, or with a top-level image list and no such
        -- part, the placeholder in the text (LLaMA-Factory / LLaVA). Without either, text that spells
        -- the placeholder is text.
        $read_images and list_bool_or(list_transform(ps, lambda p: coalesce(list_bool_or(list_transform(p.parts,
            lambda q: list_contains($image_part_types, q.type ->> '$'))), false))) as image_parts,
        case when not $read_images or imgs is null then null
            when starts_with(imgs, '[') then json_transform(imgs, '["JSON"]')::varchar[]
            else [imgs::varchar] end as top_images,
        top_images is not null and not image_parts and $placeholder <> '' as placeholders,
        coalesce(ps[1].role = 'system', false) as has_system,
        not has_system and coalesce(sys_text, tools_text) is not null as add_system
    from parsed
),
split as (
    select
        *,
        list_transform(ps, lambda p: struct_pack(
            p := p,
            text := case when placeholders then replace(coalesce({text}, ''), $placeholder, '')
                else coalesce({text}, '') end,
            image_at := case when image_parts then {parts_at} when placeholders then {placeholder_at} end,
            image_refs := case when image_parts then {part_refs}
                when placeholders then list_transform({placeholder_at}, lambda i: null::varchar) end,
            reasoning := coalesce(p.m.reasoning ->> '$', nullif({reasoning_parts}, '')),
            -- tool calls: the message's list (each item's JSON text) then its tool_call parts
            calls := list_concat(
                case when starts_with(p.m.calls, '[') then json_transform(p.m.calls, '["JSON"]')::varchar[] end,
                {call_parts},
                case when list_contains($tool_call_roles, p.source_role) and $template_tools
                    then [{text}] end)
        )) as ss,
        -- the first message with a call a template cannot render (see CALL_BAD)
        list_position(list_transform(ss, lambda s: len(list_filter(s.calls, lambda c: {call_bad})) > 0), true)
            as call_at
    from checked
),
imaged as (
    -- Every image of the record in order: a part's own reference, else the next of the top-level list.
    select
        *,
        flatten(list_transform(ss, lambda s: coalesce(s.image_refs, []))) as slots,
        len(list_filter(slots, lambda x: x is null)) as open_slots,
        case when len(slots) > 0 then list_transform(range(1, len(slots) + 1), lambda j: coalesce(slots[j],
            top_images[len(list_filter(slots[1:j], lambda x: x is null))])) end as images
    from split
),
think as (
    -- Inline reasoning (`<think>R</think>C` in assistant content, distilled reasoning data) is
    -- split off as Qwen3's template does: R is what precedes the first </think>, after the
    -- last <think> before it, newlines trimmed; C follows the last </think>, leading newlines trimmed.
    -- Records without any </think> keep their messages as they are: rebuilding each message's
    -- struct only to keep it cost a share of a chunk's parse (docs/design.md, Measured costs).
    select
        *,
        case when $parse_think and list_bool_or(list_transform(ss, lambda s: contains(s.text, '</think>')))
        then list_transform(ss, lambda s: case
            -- (a message with images keeps its text: the offsets point into it)
            when s.p.role = 'assistant' and s.reasoning is null and coalesce(len(s.image_at), 0) = 0
                and contains(s.text, '</think>') and not list_contains($tool_call_roles, s.p.source_role)
            then struct_pack(p := s.p,
                text := ltrim(string_split(s.text, '</think>')[-1], {nl}),
                reasoning := ltrim(string_split(rtrim(string_split(s.text, '</think>')[1], {nl}), '<think>')[-1], {nl}),
                calls := s.calls, image_at := s.image_at, image_refs := s.image_refs)
            else s end)
        else ss end as ts
    from imaged
),
built as (
    select
        *,
        list_transform(ts, lambda s: struct_pack(
            role := s.p.role,
            content := case
                when list_contains($tool_call_roles, s.p.source_role) and $template_tools then ''
                when $template_tools or coalesce(len(s.calls), 0) = 0 then s.text
                -- a template without a tool-call format: the calls' JSON text after the content
                when coalesce(s.p.m.calls, '[]') <> '[]' then concat_ws({nl}, nullif(s.text, ''), s.p.m.calls::varchar)
                else concat_ws({nl}, nullif(s.text, ''), array_to_string(s.calls, {nl})) end,
            train := s.p.train,
            weight := s.p.weight,
            reasoning := s.reasoning,
            calls := case when $template_tools and len(s.calls) > 0 then s.calls end,
            image_at := s.image_at
        )::{message}) as base
    from think
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
            when call_at is not null then 'bad_tool_call'
            when open_slots <> coalesce(len(top_images), 0) then 'image_count_mismatch'
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
            when 'image_count_mismatch' then open_slots || ' image ' || case when placeholders
                then 'placeholder(s) ' || $placeholder else 'part(s) without an image' end
                || ' but "' || $images_key || '" holds ' || coalesce(len(top_images), 0) || ' image(s)'
            when 'bad_tool_call' then 'message ' || (call_at - 1) || ' has a tool call without a "name": '
                || left(coalesce(list_filter(ss[call_at].calls, lambda c: {call_bad})[1], 'null'), 80)
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
                when 'bad_reasoning' then '"' || $reasoning_key || '" is ' || {kind_reasoning} || ', not a string'
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
                train := null::boolean, weight := null::double, reasoning := null::varchar,
                calls := null::varchar[], image_at := null::integer[])::{message}] || base
            when tools_text is not null then [struct_pack(role := 'system',
                content := concat_ws({nl} || {nl}, nullif(base[1].content, ''), tools_text),
                train := base[1].train, weight := base[1].weight, reasoning := base[1].reasoning,
                calls := base[1].calls, image_at := base[1].image_at)::{message}] || base[2:]
            else base end
        end as messages,
        case when reason is null and $template_tools then tools_raw_kept end as tools,
        case when reason is null then images end as images,
        dom ->> '$' as domain,
        case when reason is not null then left(line, $preview) end as raw
    from built
)
select source_line, reason, detail, raw, messages, domain, tools, images from final"""

# A message's text: the string content, or its text parts joined (a single part is the common
# case and skips the join: docs/design.md, Measured costs).
TEXT = """(case when p.parts is null then p.m.content ->> '$'
    when len(p.parts) = 1 and list_contains($part_types, p.parts[1].type ->> '$')
        then coalesce(p.parts[1].text, p.parts[1].value) ->> '$'
    else array_to_string(list_transform(list_filter(p.parts, lambda q: list_contains($part_types, q.type ->> '$')),
        lambda q: coalesce(q.text, q.value) ->> '$'), $sep) end)"""

# An image part's reference as JSON text (a path, a URI, or HF datasets' {bytes, path}), NULL for a
# bare `{"type": "image"}` (TRL's vision datasets: the next image of the top-level list).
IMAGE_REF = """coalesce(q.image, q.url, q.path,
    case when starts_with(q.image_url, '{') then q.image_url -> '$.url' else q.image_url end)::varchar"""

# Each image part's character offset in the message's text: the length of the text parts before it.
PARTS_AT = """list_transform(
    list_filter(range(1, len(p.parts) + 1), lambda i: list_contains($image_part_types, p.parts[i].type ->> '$')),
    lambda i: length(array_to_string(list_transform(list_filter(p.parts[1:i - 1],
        lambda q: list_contains($part_types, q.type ->> '$')), lambda q: coalesce(q.text, q.value) ->> '$'), $sep))::integer)"""

PART_REFS = f"""list_transform(list_filter(p.parts, lambda q: list_contains($image_part_types, q.type ->> '$')),
    lambda q: {IMAGE_REF})"""

# Each placeholder's offset in the text with the placeholders taken out.
PLACEHOLDER_AT = f"""list_transform(range(1, len(string_split(coalesce({TEXT}, ''), $placeholder))),
    lambda i: length(array_to_string(string_split(coalesce({TEXT}, ''), $placeholder)[1:i], ''))::integer)"""

# Reasoning parts (`reasoning` / `thinking`) joined like text parts; '' when there are none.
REASONING_PARTS = """array_to_string(list_transform(
    list_filter(coalesce(p.parts, []), lambda q: list_contains($reasoning_part_types, q.type ->> '$')),
    lambda q: coalesce(q.text, q.value) ->> '$'), $sep)"""

# Tool-call parts (LLaMA-Factory's `tool_call`): the call's JSON text, whether the part holds it
# as a string or as an object.
CALL_PARTS = """list_transform(
    list_filter(coalesce(p.parts, []), lambda q: list_contains($tool_call_part_types, q.type ->> '$')),
    lambda q: case when starts_with(coalesce(q.value, q.text), '"') then coalesce(q.value, q.text) ->> '$'
        else coalesce(q.value, q.text)::varchar end)"""

# A tool call `c` (its JSON text) that no template can render, as etl.tokens.tool_json.parse_call
# reads a call: not a JSON object, or no non-blank string "name" (inside "function" when that is an
# object, OpenAI's form). Rendered, it was `{"name": "", "arguments": <the whole call>}` and trained.
# CASE keeps json_type off text that is not JSON; records without calls skip it (an empty list).
CALL_BAD = """case when not json_valid(c) then true when json_type(c) <> 'OBJECT' then true
    else coalesce(trim(case when json_type(c, '$.function') = 'OBJECT' then
            case when json_type(c, '$.function.name') = 'VARCHAR' then c ->> '$.function.name' end
        when json_type(c, '$.name') = 'VARCHAR' then c ->> '$.name' end) = '', true) end"""

# Per content part: the first problem, NULL for a usable text part.
PART_ERROR = """case
    when q is null or coalesce(q.type, q.text, q.value) is null or not {type_is_string} then 'bad_content_part'
    when list_contains($image_part_types, q.type ->> '$') then case
        when not coalesce(starts_with(({ref}), '"') or starts_with(({ref}), '{{'), {bare}) then 'bad_content_part' end
    when list_contains($tool_call_part_types, q.type ->> '$') then case
        when not ({text_is_string} or starts_with(coalesce(q.text, q.value), '{{')) then 'bad_content_part' end
    when not list_contains($part_types || $reasoning_part_types, q.type ->> '$') then 'unsupported_content'
    when not {text_is_string} then 'bad_content_part'
end""".format(type_is_string=is_string("q.type"), text_is_string=is_string("coalesce(q.text, q.value)"),
             ref=IMAGE_REF, bare="coalesce(q.image, q.url, q.path, q.image_url) is null")

PART_DETAIL = """'content part ' || (part_at - 1) || case
    when errs[err_at] = 'unsupported_content' then ' has type "' || (ps[err_at].parts[part_at].type ->> '$')
        || '"; supported part types: ' || array_to_string($part_types || $reasoning_part_types || $tool_call_part_types || $image_part_types, ', ')
    when not {type_is_string} then ' is not an object with a string "type"'
    when list_contains($image_part_types, ps[err_at].parts[part_at].type ->> '$') then ' of type "'
        || (ps[err_at].parts[part_at].type ->> '$') || '" has no image: expected "image", "url" or "path" '
        || '(a path, a URI or {{"bytes", "path"}}) or "image_url": {{"url": ...}}'
    else ' of type "' || (ps[err_at].parts[part_at].type ->> '$') || '" has no string "text" or "value"'
end""".format(type_is_string=is_string("ps[err_at].parts[part_at].type"))
