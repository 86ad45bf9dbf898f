-- Image resolutions, per split, for outputs of image runs: images by their long side (the larger
-- of width and height from image_sizes, as load_image sees the image) in power-of-two bins
-- [long_side_from, long_side_to), every bin from the smallest image's to the largest's listed.
-- Powers of two because sizes span orders of magnitude (a 10-pixel icon, a 4,000-pixel photo):
-- equal-width bins would put most images in one. Each bin: its images' mean width, height and
-- megapixels, and the tokens they cost (t*h*w / merge_size^2 per image).
-- Parameters: $data (list of data files), $manifest (path of _manifest.json).
with rule as (
    select (content::json->>'$.images.merge_size')::bigint as merge_size
    from read_text($manifest)
),

pictures as (
    select
        split,
        size[1] as width,
        size[2] as height,
        floor(log2(greatest(size[1], size[2], 1)))::integer as bin,
        grid[1] * grid[2] * grid[3] as patches
    from (
        select
            split,
            unnest(image_sizes) as size,
            unnest(image_grid_thw) as grid
        from read_parquet($data)
    )
),

counted as (
    select
        p.split,
        p.bin,
        count(*) as images,
        round(avg(p.width), 1) as mean_width,
        round(avg(p.height), 1) as mean_height,
        round(avg(p.width * p.height) / 1e6, 4) as mean_megapixels,
        (sum(p.patches) // (r.merge_size * r.merge_size))::bigint as image_tokens
    from pictures as p, rule as r
    group by p.split, p.bin, r.merge_size
),

bins as (
    select unnest(range(min(bin), max(bin) + 1)) as bin
    from pictures
),

splits as (
    select distinct split
    from pictures
),

final as (
    select
        s.split,
        (2::bigint ** b.bin)::bigint as long_side_from,
        (2::bigint ** (b.bin + 1))::bigint as long_side_to,
        coalesce(c.images, 0) as images,
        c.mean_width,
        c.mean_height,
        c.mean_megapixels,
        coalesce(c.image_tokens, 0)::bigint as image_tokens
    from splits as s
    cross join bins as b
    left join counted as c
        on c.split = s.split and c.bin = b.bin
    order by s.split, b.bin
)

select * from final
