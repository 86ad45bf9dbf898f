-- Trained, kept assistant turns whose end-of-turn token is missing or carries no loss.
-- Rule: a role's end-of-turn id is the last id of template.roles[role].end_ids in the manifest
-- (the manifest's eot_id when absent), and a turn's end-of-turn is the LAST occurrence of that
-- id inside [start, end). Content never holds special ids (DESIGN section 3), so that occurrence
-- is the template's whatever separator follows it. eot_pos is null (has_eot false) when the turn
-- has none, e.g. a hard cut that lost it.
-- Rows are expected when end-of-turn training is 'none', or 'last' (all but the last turn).
-- Parameters: $manifest (path of _manifest.json), $data (data files), $turns (turns files).
with manifest as (
    select content::json as j
    from read_text($manifest)
),

role_templates as (
    select
        unnest(map_entries(coalesce(
            json_transform(j->'$.template.roles', '"MAP(VARCHAR, JSON)"'), map()
        ))) as e
    from manifest
),

end_tokens as (
    select
        e.key as role,
        json_transform(e.value->'$.end_ids', '"INTEGER[]"')[-1] as end_id
    from role_templates
),

assistant_turns as (
    select
        t.id,
        t.turn_index,
        t."start",
        t."end",
        coalesce(x.end_id, (select (j->>'$.eot_id')::integer from manifest)) as end_id
    from read_parquet($turns) as t
    left join end_tokens as x
        on x.role = t.role
    where t.role = 'assistant' and t.kept and t.trained
),

located as (
    select
        e.split,
        a.*,
        list_slice(e.loss_mask, a."start" + 1, a."end") as turn_mask,
        -- list_position finds the first match: search the reversed turn for the last one
        list_position(list_reverse(list_slice(e.input_ids, a."start" + 1, a."end")), a.end_id)
            as from_end
    from assistant_turns as a
    inner join read_parquet($data) as e
        on e.id = a.id
),

final as (
    select
        split,
        id,
        turn_index,
        "start",
        "end",
        end_id,
        ("end" - from_end)::bigint as eot_pos,
        from_end is not null as has_eot
    from located
    where from_end is null
        or coalesce(turn_mask[len(turn_mask) - from_end + 1]::integer, 0) = 0
    order by split, id, turn_index
)

select * from final
