-- Trained, kept assistant turns whose end-of-turn token is not trained.
-- Rule: a kept turn spans [start, end) and ends with end-of-turn then the role's separator, so
-- the end-of-turn sits at eot_pos = end - 1 - len(template.roles[role].sep_ids) (0 when the
-- manifest has no sep_ids for the role). is_eot says whether the token there is the manifest's
-- eot_id; false points at a template whose end token differs (or a wrong separator length).
-- Rows are expected when end-of-turn training is 'none' or 'last' (all but the last turn).
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

separators as (
    select
        e.key as role,
        coalesce(json_array_length(e.value, '$.sep_ids'), 0)::integer as sep_len
    from role_templates
),

assistant_turns as (
    select
        t.id,
        t.turn_index,
        t."start",
        t."end",
        (t."end" - 1 - coalesce(s.sep_len, 0))::bigint as eot_pos
    from read_parquet($turns) as t
    left join separators as s
        on s.role = t.role
    where t.role = 'assistant' and t.kept and t.trained
),

checked as (
    select
        e.split,
        a.id,
        a.turn_index,
        a."start",
        a."end",
        a.eot_pos,
        -- guard: a negative DuckDB list index counts from the end
        case when a.eot_pos >= a."start" then e.input_ids[a.eot_pos + 1] end as token_id,
        case when a.eot_pos >= a."start" then e.loss_mask[a.eot_pos + 1]::integer end as eot_mask
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
        eot_pos,
        token_id,
        coalesce(token_id = (select (j->>'$.eot_id')::integer from manifest), false) as is_eot
    from checked
    where coalesce(eot_mask, 0) = 0
    order by split, id, turn_index
)

select * from final
