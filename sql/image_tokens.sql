-- Tokens per image, per split, for outputs of image runs: each image's t*h*w / merge_size^2 (its
-- grid from image_grid_thw, merge_size from the manifest's images block) in power-of-two bins
-- [tokens_from, tokens_to), every bin from the cheapest image's to the dearest's listed. Powers of
-- two, as image_sizes: an image costs from 4 tokens to the max_pixels cap (16,384 for Qwen2.5-VL).
-- Parameters: $data (list of data files), $manifest (path of _manifest.json).
with rule as (
    select (content::json->>'$.images.merge_size')::bigint as merge_size
    from read_text($manifest)
),

pictures as (
    select
        p.split,
        p.grid[1] * p.grid[2] * p.grid[3] // (r.merge_size * r.merge_size) as tokens
    from (select split, unnest(image_grid_thw) as grid from read_parquet($data)) as p, rule as r
),

counted as (
    select
        split,
        floor(log2(greatest(tokens, 1)))::integer as bin,
        count(*) as images,
        sum(tokens)::bigint as tokens
    from pictures
    group by all
),

bins as (
    select unnest(range(min(bin), max(bin) + 1)) as bin
    from counted
),

splits as (
    select distinct split
    from counted
),

final as (
    select
        s.split,
        (2::bigint ** b.bin)::bigint as tokens_from,
        (2::bigint ** (b.bin + 1))::bigint as tokens_to,
        coalesce(c.images, 0) as images,
        coalesce(c.tokens, 0)::bigint as tokens
    from splits as s
    cross join bins as b
    left join counted as c
        on c.split = s.split and c.bin = b.bin
    order by s.split, b.bin
)

select * from final
