-- Images per example, per split, for outputs of image runs: examples with 0, 1, 2, ... images
-- (every count up to the largest, empty ones as zero rows) and their image tokens.
-- Parameters: $data (list of data files).
with examples as (
    select
        split,
        len(image_grid_thw) as images,
        num_image_tokens
    from read_parquet($data)
),

counted as (
    select
        split,
        images,
        count(*) as examples,
        sum(num_image_tokens)::bigint as image_tokens
    from examples
    group by all
),

counts as (
    select unnest(range(0, (select coalesce(max(images), -1) + 1 from examples))) as images
),

splits as (
    select distinct split
    from examples
),

final as (
    select
        s.split,
        n.images::bigint as images,
        coalesce(c.examples, 0) as examples,
        coalesce(c.image_tokens, 0)::bigint as image_tokens
    from splits as s
    cross join counts as n
    left join counted as c
        on c.split = s.split and c.images = n.images
    order by s.split, n.images
)

select * from final
