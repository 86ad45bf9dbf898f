-- Scores carried from the input (score_chosen, score_rejected), per split and over all splits
-- ('(all)'): scored = pairs with both scores, ties = scored pairs whose scores are equal (no
-- preference signal a margin-based loss can use), chosen_higher / chosen_lower the rest;
-- tie_share is of the scored pairs; mean_margin = mean(score_chosen - score_rejected).
-- Parameters: $data (list of data files).
with pairs as (
    select
        split,
        score_chosen,
        score_rejected,
        score_chosen is not null and score_rejected is not null as scored
    from read_parquet($data)
),

final as (
    select
        case when grouping(split) = 1 then '(all)' else split end as split,
        count(*) as pairs,
        count(*) filter (where scored) as scored,
        count(*) filter (where scored and score_chosen = score_rejected) as ties,
        count(*) filter (where scored and score_chosen > score_rejected) as chosen_higher,
        count(*) filter (where scored and score_chosen < score_rejected) as chosen_lower,
        round(
            count(*) filter (where scored and score_chosen = score_rejected)
                / nullif(count(*) filter (where scored), 0),
            4
        ) as tie_share,
        round(avg(score_chosen - score_rejected), 4) as mean_margin
    from pairs
    group by grouping sets ((split), ())
    order by grouping(split), split
)

select * from final
