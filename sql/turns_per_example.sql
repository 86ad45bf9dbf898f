-- Distribution of kept turns per example, per split, with how many of those examples lost turns.
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
        sum(num_turns_dropped)::bigint as turns_dropped
    from examples
    group by split, num_turns
    order by split, num_turns
)

select * from final
