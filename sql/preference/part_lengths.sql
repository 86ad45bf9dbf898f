-- Token length percentiles of each part of a preference or unpaired output, per split and over
-- all splits ('(all)'): prompt, chosen, rejected (preference) or prompt, completion (unpaired),
-- and total (num_tokens: prompt + chosen + rejected, the prefix-shared layout, or prompt +
-- completion). quantile_disc returns an observed length (numpy's method="inverted_cdf").
-- Parameters: $data (list of data files).
with parts as (
    unpivot (
        select
            split,
            num_tokens as num_total_tokens,
            columns('^num_(prompt|chosen|rejected|completion)_tokens$')
        from read_parquet($data)
    )
    on columns(* exclude (split))
    into name part value tokens
),

named as (
    select
        split,
        regexp_extract(part, '^num_(.*)_tokens$', 1) as part,
        tokens
    from parts
),

final as (
    select
        case when grouping(split) = 1 then '(all)' else split end as split,
        part,
        count(*) as rows,
        coalesce(sum(tokens), 0)::bigint as tokens,
        min(tokens) as min,
        quantile_disc(tokens, 0.50) as p50,
        quantile_disc(tokens, 0.90) as p90,
        quantile_disc(tokens, 0.99) as p99,
        max(tokens) as max,
        round(avg(tokens), 2) as mean
    from named
    group by grouping sets ((split, part), (part))
    order by
        grouping(split),
        split,
        list_position(['prompt', 'chosen', 'rejected', 'completion', 'total'], part)
)

select * from final
