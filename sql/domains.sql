-- Examples, tokens and losses per domain and split.
-- Parameters: $data (list of data files).
with examples as (
    select
        domain,
        split,
        num_tokens,
        num_trained,
        num_turns_dropped,
        truncated
    from read_parquet($data)
),

final as (
    select
        domain,
        split,
        count(*) as examples,
        sum(num_tokens)::bigint as tokens,
        sum(num_trained)::bigint as trained_tokens,
        round(sum(num_trained)::double / nullif(sum(num_tokens), 0), 4) as trained_share,
        round(avg(num_tokens), 2) as mean_tokens,
        count(*) filter (where truncated) as truncated,
        sum(num_turns_dropped)::bigint as turns_dropped
    from examples
    group by domain, split
    order by domain, split
)

select * from final
