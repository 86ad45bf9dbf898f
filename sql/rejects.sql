-- Rejected input rows per reason, with the first one (by file and line) as an example to look at.
-- Parameters: $rejects (list of DST/_rejects/*.parquet files).
with rejects as (
    select
        reason,
        source_file,
        source_line,
        detail
    from read_parquet($rejects)
),

final as (
    select
        reason,
        count(*) as rejects,
        count(distinct source_file) as files,
        arg_min(source_file || ':' || source_line, (source_file, source_line)) as first_at,
        arg_min(detail, (source_file, source_line)) as first_detail
    from rejects
    group by reason
    order by rejects desc, reason
)

select * from final
