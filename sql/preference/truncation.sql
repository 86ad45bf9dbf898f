-- Truncation of a preference output, per split and over all splits ('(all)'), beside the run's
-- policy (config.truncation), fit (preference.fit: "separate" fits prompt + the longer completion
-- in seq_len, "shared" prompt + chosen + rejected) and seq_len. truncated = pairs cut or that lost
-- prompt turns; prompt_turns_dropped sums num_turns_dropped. over_shared_seq_len = written pairs
-- whose prefix-shared layout (num_tokens) exceeds seq_len, recounted; manifest_over_shared_seq_len
-- is the run's own figure (the (all) row only). Pairs dropped, by reason (pair_too_long...): drops.
-- Parameters: $manifest (path of _manifest.json), $data (list of data files).
with manifest as (
    select content::json as j
    from read_text($manifest)
),

run as (
    select
        j->>'$.config.truncation' as policy,
        j->>'$.preference.fit' as fit,
        (j->>'$.seq_len')::bigint as seq_len,
        (j->>'$.preference.over_shared_seq_len')::bigint as over_shared
    from manifest
),

pairs as (
    select
        split,
        truncated,
        num_turns_dropped,
        num_tokens
    from read_parquet($data)
),

counted as (
    select
        case when grouping(p.split) = 1 then '(all)' else p.split end as split,
        grouping(p.split) as whole,
        count(*) as pairs,
        count(*) filter (where p.truncated) as truncated,
        count(*) filter (where p.num_turns_dropped > 0) as pairs_with_turns_dropped,
        coalesce(sum(p.num_turns_dropped), 0)::bigint as prompt_turns_dropped,
        count(*) filter (where p.num_tokens > r.seq_len) as over_shared_seq_len
    from pairs as p
    cross join run as r
    group by grouping sets ((p.split), ())
),

final as (
    select
        c.split,
        r.policy,
        r.fit,
        r.seq_len,
        c.pairs,
        c.truncated,
        round(c.truncated / nullif(c.pairs, 0), 4) as truncated_share,
        c.pairs_with_turns_dropped,
        c.prompt_turns_dropped,
        c.over_shared_seq_len,
        case when c.whole = 1 then r.over_shared end as manifest_over_shared_seq_len
    from counted as c
    cross join run as r
    order by c.whole, c.split
)

select * from final
