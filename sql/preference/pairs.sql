-- Pairs and tokens per split and over all splits ('(all)'), of a preference output.
-- tokens = sum of num_tokens (prompt + chosen + rejected: the prefix-shared layout, each prompt
-- once); unshared_tokens = 2 * prompt + chosen + rejected, what chosen-then-rejected rows (TRL's
-- padded batch) hold before padding, so shared_saving is the share prefix sharing saves.
-- chosen_trained / rejected_trained count True mask entries (False only inside a multi-turn
-- completion, e.g. a tool result).
-- Parameters: $data (list of DST/data/*/*.parquet files).
with pairs as (
    select
        split,
        num_tokens,
        num_prompt_tokens,
        num_chosen_tokens,
        num_rejected_tokens,
        list_count(list_filter(chosen_mask, lambda x: x)) as chosen_trained,
        list_count(list_filter(rejected_mask, lambda x: x)) as rejected_trained
    from read_parquet($data)
),

final as (
    select
        case when grouping(split) = 1 then '(all)' else split end as split,
        count(*) as pairs,
        coalesce(sum(num_tokens), 0)::bigint as tokens,
        coalesce(sum(num_prompt_tokens), 0)::bigint as prompt_tokens,
        coalesce(sum(num_chosen_tokens), 0)::bigint as chosen_tokens,
        coalesce(sum(num_rejected_tokens), 0)::bigint as rejected_tokens,
        coalesce(sum(chosen_trained), 0)::bigint as chosen_trained,
        coalesce(sum(rejected_trained), 0)::bigint as rejected_trained,
        coalesce(sum(2 * num_prompt_tokens + num_chosen_tokens + num_rejected_tokens), 0)::bigint
            as unshared_tokens,
        round(
            sum(num_prompt_tokens)::double
                / nullif(sum(2 * num_prompt_tokens + num_chosen_tokens + num_rejected_tokens), 0),
            4
        ) as shared_saving
    from pairs
    group by grouping sets ((split), ())
    order by grouping(split), split
)

select * from final
