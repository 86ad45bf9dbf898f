-- Consistency of an etl output with its own contract: each rule counts the examples or turns
-- that break it, and names one (the smallest id) to look at with `etl inspect --id`.
-- Every count should be 0, except num_tokens <= seq_len for outputs written by other tools.
-- Parameters: $manifest (path of _manifest.json), $data (data files), $turns (turns files).
with manifest as (
    select content::json as j
    from read_text($manifest)
),

examples as (
    select
        id,
        loss_mask,
        num_tokens,
        num_trained,
        num_turns,
        num_turns_dropped,
        len(input_ids) as ids_len,
        len(loss_mask) as mask_len,
        coalesce(list_sum(list_transform(loss_mask, lambda m: m::integer)), 0) as mask_trained
    from read_parquet($data)
),

turns as (
    select *
    from read_parquet($turns)
),

turn_counts as (
    select
        id,
        count(*) as all_turns,
        count(*) filter (where not kept) as dropped
    from turns
    group by id
),

example_flags as (
    select
        e.id,
        e.num_tokens != e.ids_len as bad_num_tokens,
        e.mask_len != e.ids_len as bad_mask_len,
        e.num_trained != e.mask_trained as bad_num_trained,
        c.id is null as no_turns,
        e.num_turns != coalesce(c.all_turns, 0) as bad_num_turns,
        e.num_turns_dropped != coalesce(c.dropped, 0) as bad_num_turns_dropped,
        e.ids_len > (select (j->>'$.seq_len')::integer from manifest) as too_long
    from examples as e
    left join turn_counts as c
        on c.id = e.id
),

turn_flags as (
    select
        t.id,
        e.id is null as orphan,
        t.kept and (t."start" < 0 or t."start" > t."end" or t."end" > e.ids_len) as bad_offsets,
        not t.kept and (t."start" != -1 or t."end" != -1) as bad_dropped_offsets,
        t.kept and not t.trained and coalesce(list_sum(list_transform(
            list_slice(e.loss_mask, t."start" + 1, t."end"), lambda m: m::integer
        )), 0) > 0 as trained_in_untrained_turn
    from turns as t
    left join examples as e
        on e.id = t.id
),

rules as (
    select 1 as ord, 'num_tokens = len(input_ids)' as rule, 'examples' as unit,
        count(*) filter (where bad_num_tokens) as violations,
        min(id) filter (where bad_num_tokens) as first_id
    from example_flags
    union all
    select 2, 'len(loss_mask) = len(input_ids)', 'examples',
        count(*) filter (where bad_mask_len), min(id) filter (where bad_mask_len)
    from example_flags
    union all
    select 3, 'num_trained = trained tokens in loss_mask', 'examples',
        count(*) filter (where bad_num_trained), min(id) filter (where bad_num_trained)
    from example_flags
    union all
    select 4, 'num_tokens <= seq_len', 'examples',
        count(*) filter (where too_long), min(id) filter (where too_long)
    from example_flags
    union all
    select 5, 'example has turns rows', 'examples',
        count(*) filter (where no_turns), min(id) filter (where no_turns)
    from example_flags
    union all
    select 6, 'num_turns = turns rows (kept or not)', 'examples',
        count(*) filter (where bad_num_turns), min(id) filter (where bad_num_turns)
    from example_flags
    union all
    select 7, 'num_turns_dropped = dropped turns', 'examples',
        count(*) filter (where bad_num_turns_dropped), min(id) filter (where bad_num_turns_dropped)
    from example_flags
    union all
    select 8, 'turn belongs to an example', 'turns',
        count(*) filter (where orphan), min(id) filter (where orphan)
    from turn_flags
    union all
    select 9, 'kept turn inside [0, num_tokens)', 'turns',
        count(*) filter (where bad_offsets), min(id) filter (where bad_offsets)
    from turn_flags
    union all
    select 10, 'dropped turn has start = end = -1', 'turns',
        count(*) filter (where bad_dropped_offsets), min(id) filter (where bad_dropped_offsets)
    from turn_flags
    union all
    select 11, 'untrained turn has no trained token', 'turns',
        count(*) filter (where trained_in_untrained_turn),
        min(id) filter (where trained_in_untrained_turn)
    from turn_flags
),

final as (
    select
        rule,
        unit,
        violations,
        first_id
    from rules
    order by ord
)

select * from final
