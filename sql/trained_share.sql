-- Share of tokens that carry loss, per split and overall ('(all)').
-- trained_in_mask recounts loss_mask itself: it must equal trained_tokens (num_trained).
-- Parameters: $data (list of data files).
with examples as (
    select
        split,
        num_tokens,
        num_trained,
        coalesce(list_sum(list_transform(loss_mask, lambda m: m::integer)), 0)::bigint
            as mask_trained
    from read_parquet($data)
),

final as (
    select
        case when grouping(split) = 1 then '(all)' else split end as split,
        count(*) as examples,
        coalesce(sum(num_tokens), 0)::bigint as tokens,
        coalesce(sum(num_trained), 0)::bigint as trained_tokens,
        coalesce(sum(mask_trained), 0)::bigint as trained_in_mask,
        round(sum(num_trained)::double / nullif(sum(num_tokens), 0), 4) as trained_share,
        round(avg(num_trained::double / nullif(num_tokens, 0)), 4) as mean_example_share,
        count(*) filter (where num_trained = 0) as examples_untrained
    from examples
    group by grouping sets ((split), ())
    order by grouping(split), split
)

select * from final
