-- Length bias of a preference output, per split and over all splits ('(all)'): pairs whose chosen
-- completion is longer than, as long as, or shorter than the rejected one (in tokens), as counts
-- and shares of the pairs. DPO is known to learn this bias: a chosen_longer_share far above 0.5
-- teaches length. difference = num_chosen_tokens - num_rejected_tokens; median_difference is an
-- observed difference (quantile_disc).
-- Parameters: $data (list of data files).
with pairs as (
    select
        split,
        num_chosen_tokens - num_rejected_tokens as difference
    from read_parquet($data)
),

final as (
    select
        case when grouping(split) = 1 then '(all)' else split end as split,
        count(*) as pairs,
        count(*) filter (where difference > 0) as chosen_longer,
        count(*) filter (where difference = 0) as equal_length,
        count(*) filter (where difference < 0) as chosen_shorter,
        round(count(*) filter (where difference > 0) / nullif(count(*), 0), 4)
            as chosen_longer_share,
        round(count(*) filter (where difference = 0) / nullif(count(*), 0), 4) as equal_share,
        round(count(*) filter (where difference < 0) / nullif(count(*), 0), 4)
            as chosen_shorter_share,
        round(avg(difference), 2) as mean_difference,
        quantile_disc(difference, 0.50) as median_difference
    from pairs
    group by grouping sets ((split), ())
    order by grouping(split), split
)

select * from final
