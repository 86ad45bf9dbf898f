-- Histogram of part lengths over all splits: rows per bin [bin_start, bin_end) of $bin_width
-- tokens for each of prompt, chosen, rejected (preference) or prompt, completion (unpaired);
-- empty bins included (zero rows) up to the longest part, so the parts share one axis.
-- Parameters: $data (list of data files), $bin_width (tokens per bin, >= 1).
with parts as (
    unpivot (
        select columns('^num_(prompt|chosen|rejected|completion)_tokens$')
        from read_parquet($data)
    )
    on columns(*)
    into name part value tokens
),

named as (
    select
        regexp_extract(part, '^num_(.*)_tokens$', 1) as part,
        tokens
    from parts
),

counted as (
    select
        part,
        (tokens // $bin_width) * $bin_width as bin_start,
        count(*) as rows
    from named
    group by all
),

bins as (
    select
        unnest(range(0, (select coalesce(max(tokens), 0) // $bin_width + 1 from named)))
            * $bin_width as bin_start
),

present as (
    select distinct part
    from named
),

final as (
    select
        p.part,
        b.bin_start::bigint as bin_start,
        (b.bin_start + $bin_width)::bigint as bin_end,
        coalesce(c.rows, 0) as rows
    from present as p
    cross join bins as b
    left join counted as c
        on c.part = p.part and c.bin_start = b.bin_start
    order by list_position(['prompt', 'chosen', 'rejected', 'completion'], p.part), b.bin_start
)

select * from final
