-- Images per split and over all splits ('(all)'), for outputs of image runs: examples with
-- images, images and distinct images (by sha256), image tokens and their share of all tokens.
-- image_tokens_in_grids recounts image tokens from the grids (t*h*w / merge_size^2 per image,
-- merge_size from the manifest's images block): it must equal image_tokens (num_image_tokens).
-- mean_example_share averages num_image_tokens / num_tokens over the examples with images.
-- Parameters: $data (list of data files), $manifest (path of _manifest.json).
with rule as (
    select (content::json->>'$.images.merge_size')::bigint as merge_size
    from read_text($manifest)
),

examples as (
    select
        d.split,
        d.num_tokens,
        d.num_image_tokens,
        len(d.image_grid_thw) as images,
        coalesce(
            list_sum(list_transform(d.image_grid_thw, lambda g: g[1] * g[2] * g[3])), 0
        )::bigint // (r.merge_size * r.merge_size) as grid_tokens
    from read_parquet($data) as d, rule as r
),

per_example as (
    select
        case when grouping(split) = 1 then '(all)' else split end as split,
        count(*) as examples,
        count(*) filter (where images > 0) as examples_with_images,
        coalesce(sum(images), 0)::bigint as images,
        coalesce(sum(num_tokens), 0)::bigint as tokens,
        coalesce(sum(num_image_tokens), 0)::bigint as image_tokens,
        coalesce(sum(grid_tokens), 0)::bigint as image_tokens_in_grids,
        round(sum(num_image_tokens)::double / nullif(sum(num_tokens), 0), 4) as image_token_share,
        round(avg(num_image_tokens::double / nullif(num_tokens, 0)) filter (where images > 0), 4)
            as mean_example_share
    from examples
    group by grouping sets ((split), ())
),

distinct_images as (
    select
        case when grouping(split) = 1 then '(all)' else split end as split,
        count(distinct sha256) as distinct_images
    from (select split, unnest(image_sha256) as sha256 from read_parquet($data))
    group by grouping sets ((split), ())
),

final as (
    select
        e.split,
        e.examples,
        e.examples_with_images,
        e.images,
        coalesce(d.distinct_images, 0) as distinct_images,
        e.tokens,
        e.image_tokens,
        e.image_tokens_in_grids,
        e.image_token_share,
        e.mean_example_share
    from per_example as e
    left join distinct_images as d
        on d.split = e.split
    order by e.split = '(all)', e.split
)

select * from final
