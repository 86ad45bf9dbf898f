-- Examples with no trained token (by num_trained or by the loss_mask itself). etl run drops
-- these, so any row here means the output is inconsistent or was written by another tool.
-- Parameters: $data (list of data files).
with examples as (
    select
        split,
        id,
        source_file,
        source_line,
        domain,
        num_tokens,
        num_trained,
        coalesce(list_sum(list_transform(loss_mask, lambda m: m::integer)), 0)::bigint
            as mask_trained,
        num_turns,
        truncated
    from read_parquet($data)
),

final as (
    select *
    from examples
    where num_trained = 0 or mask_trained = 0
    order by split, source_file, source_line, id
)

select * from final
