-- Image-token share per example (num_image_tokens / num_tokens), per split, for outputs of image
-- runs: examples with images in ten bins [percent_from, percent_to) of 10 points (the last one
-- holds 100%), every bin listed. Examples without images are left out (`images_per_example`
-- counts them).
-- Integer arithmetic picks the bin, so a share of exactly 30% lands in [30, 40).
-- Parameters: $data (list of data files).
with examples as (
    select
        split,
        least(num_image_tokens * 10 // num_tokens, 9) as bin
    from read_parquet($data)
    where len(image_grid_thw) > 0 and num_tokens > 0
),

counted as (
    select
        split,
        bin,
        count(*) as examples
    from examples
    group by all
),

splits as (
    select distinct split
    from examples
),

final as (
    select
        s.split,
        (b.bin * 10)::bigint as percent_from,
        (b.bin * 10 + 10)::bigint as percent_to,
        coalesce(c.examples, 0) as examples
    from splits as s
    cross join (select unnest(range(0, 10)) as bin) as b
    left join counted as c
        on c.split = s.split and c.bin = b.bin
    order by s.split, b.bin
)

select * from final
