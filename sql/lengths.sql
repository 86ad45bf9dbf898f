-- Token length percentiles per split and over all splits ('(all)').
-- quantile_disc returns an observed length (numpy's method="inverted_cdf").
-- Parameters: $data (list of DST/data/*/*.parquet files).
with examples as (
    select
        split,
        num_tokens,
        num_trained
    from read_parquet($data)
),

final as (
    select
        case when grouping(split) = 1 then '(all)' else split end as split,
        count(*) as examples,
        coalesce(sum(num_tokens), 0)::bigint as tokens,
        min(num_tokens) as min,
        quantile_disc(num_tokens, 0.10) as p10,
        quantile_disc(num_tokens, 0.50) as p50,
        quantile_disc(num_tokens, 0.90) as p90,
        quantile_disc(num_tokens, 0.95) as p95,
        quantile_disc(num_tokens, 0.99) as p99,
        max(num_tokens) as max,
        round(avg(num_tokens), 2) as mean
    from examples
    group by grouping sets ((split), ())
    order by grouping(split), split
)

select * from final
