-- Histogram of example lengths per split: bins [bin_start, bin_end) of $bin_width tokens,
-- empty bins included (zero rows) so plots and readers see the gaps.
-- Parameters: $data (list of data files), $bin_width (tokens per bin, >= 1).
with examples as (
    select
        split,
        num_tokens
    from read_parquet($data)
),

counted as (
    select
        split,
        (num_tokens // $bin_width) * $bin_width as bin_start,
        count(*) as examples
    from examples
    group by all
),

bins as (
    select
        unnest(range(0, (select coalesce(max(num_tokens), 0) // $bin_width + 1 from examples)))
            * $bin_width as bin_start
),

splits as (
    select distinct split
    from examples
),

final as (
    select
        s.split,
        b.bin_start::bigint as bin_start,
        (b.bin_start + $bin_width)::bigint as bin_end,
        coalesce(c.examples, 0) as examples
    from splits as s
    cross join bins as b
    left join counted as c
        on c.split = s.split and c.bin_start = b.bin_start
    order by s.split, b.bin_start
)

select * from final
