-- Turns and tokens per role. kept_tokens = end - start of kept turns (what is in input_ids);
-- dropped_tokens = num_tokens of turns removed by truncation; trained_tokens counts loss_mask
-- inside [start, end) of each kept turn.
-- Parameters: $data (list of data files), $turns (list of turns files).
with turns as (
    select
        id,
        role,
        "start",
        "end",
        num_tokens,
        trained,
        kept
    from read_parquet($turns)
),

examples as (
    select
        id,
        loss_mask
    from read_parquet($data)
),

turn_mask as (
    select
        t.*,
        coalesce(
            list_sum(list_transform(
                list_slice(e.loss_mask, t."start" + 1, t."end"), lambda m: m::integer
            )),
            0
        ) as trained_tokens
    from turns as t
    left join examples as e
        on e.id = t.id and t.kept
),

final as (
    select
        role,
        count(*) as turns,
        count(*) filter (where kept) as kept_turns,
        count(*) filter (where not kept) as dropped_turns,
        count(*) filter (where kept and trained) as trained_turns,
        coalesce(sum("end" - "start") filter (where kept), 0)::bigint as kept_tokens,
        coalesce(sum(num_tokens) filter (where not kept), 0)::bigint as dropped_tokens,
        coalesce(sum(trained_tokens), 0)::bigint as trained_tokens,
        round(sum(trained_tokens)::double / nullif(sum("end" - "start") filter (where kept), 0), 4)
            as trained_share
    from turn_mask
    group by role
    order by role
)

select * from final
