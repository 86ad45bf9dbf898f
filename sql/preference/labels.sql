-- Label balance of an unpaired (KTO) output, per split and over all splits ('(all)'):
-- desirable = rows labelled true, undesirable = false; desirable_share of the rows (KTO weighs
-- the two sides, so a skew here sets its desirable/undesirable weights); tokens of prompts and
-- completions; mean completion length per label (a length bias between the labels).
-- Parameters: $data (list of data files).
with rows_ as (
    select
        split,
        label,
        num_tokens,
        num_prompt_tokens,
        num_completion_tokens,
        truncated
    from read_parquet($data)
),

final as (
    select
        case when grouping(split) = 1 then '(all)' else split end as split,
        count(*) as rows,
        count(*) filter (where label) as desirable,
        count(*) filter (where not label) as undesirable,
        round(count(*) filter (where label) / nullif(count(*), 0), 4) as desirable_share,
        coalesce(sum(num_tokens), 0)::bigint as tokens,
        coalesce(sum(num_prompt_tokens), 0)::bigint as prompt_tokens,
        coalesce(sum(num_completion_tokens), 0)::bigint as completion_tokens,
        round(avg(num_completion_tokens) filter (where label), 2) as mean_completion_desirable,
        round(avg(num_completion_tokens) filter (where not label), 2)
            as mean_completion_undesirable,
        count(*) filter (where truncated) as truncated
    from rows_
    group by grouping sets ((split), ())
    order by grouping(split), split
)

select * from final
