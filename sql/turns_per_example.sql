-- Turns per conversation, per split: num_turns counts every turn of the conversation (the
-- injected default system turn included, dropped turns included, as `etl run` writes it);
-- kept turns = num_turns - num_turns_dropped.
-- Parameters: $data (list of data files).
with examples as (
    select
        split,
        num_turns,
        num_turns_dropped
    from read_parquet($data)
),

final as (
    select
        split,
        num_turns,
        count(*) as examples,
        count(*) filter (where num_turns_dropped > 0) as examples_with_dropped_turns,
        sum(num_turns_dropped)::bigint as turns_dropped,
        round(avg(num_turns - num_turns_dropped), 2) as mean_kept_turns
    from examples
    group by split, num_turns
    order by split, num_turns
)

select * from final
