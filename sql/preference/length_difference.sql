-- Histogram of num_chosen_tokens - num_rejected_tokens over all pairs: pairs per bin
-- [bin_start, bin_end). Equal lengths have a bin of their own, [0, 1), so every bin right of it
-- holds only pairs whose chosen completion is longer and every bin left of it only shorter ones:
-- [1, 1 + w), [1 + w, 1 + 2w)... and [-w, 0), [-2w, -w)... for w = $bin_width. Empty bins
-- included between the smallest and the largest difference (the zero bin always, when any pair).
-- Parameters: $data (list of data files), $bin_width (tokens per bin, >= 1).
with pairs as (
    select
        case
            when num_chosen_tokens > num_rejected_tokens
                then floor((num_chosen_tokens - num_rejected_tokens - 1) / $bin_width)
                    * $bin_width + 1
            else floor((num_chosen_tokens - num_rejected_tokens) / $bin_width) * $bin_width
        end::bigint as bin_start
    from read_parquet($data)
),

counted as (
    select
        bin_start,
        count(*) as pairs
    from pairs
    group by bin_start
),

bins as (
    select unnest(
        range(least((select min(bin_start) from pairs), 0), 0, $bin_width)
        || [0]
        || range(1, greatest((select max(bin_start) from pairs), 0) + 1, $bin_width)
    ) as bin_start
    where (select count(*) from pairs) > 0
),

final as (
    select
        b.bin_start::bigint as bin_start,
        (case when b.bin_start = 0 then 1 else b.bin_start + $bin_width end)::bigint as bin_end,
        coalesce(c.pairs, 0) as pairs
    from bins as b
    left join counted as c
        on c.bin_start = b.bin_start
    order by b.bin_start
)

select * from final
