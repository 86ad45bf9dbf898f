-- Where examples went: read, written, truncated, dropped{reason}, rejected{reason}.
-- manifest = counts in _manifest.json; observed = the same figure recounted from the Parquet
-- (null where the output cannot show it: dropped examples are not written anywhere).
-- accounting_gap = read - written - sum(dropped) - sum(rejected); it must be 0.
-- A mixture writes some records more than once: copy k > 1 has id `<id>#k`, counted as repeated
-- (data rows = written + repeated), not as written.
-- Parameters: $manifest (path of _manifest.json), $data (data files), $rejects (rejects files).
with manifest as (
    select content::json as j
    from read_text($manifest)
),

counts as (
    select
        (j->>'$.counts.read')::bigint as read,
        (j->>'$.counts.written')::bigint as written,
        (j->>'$.counts.repeated')::bigint as repeated,
        (j->>'$.counts.truncated')::bigint as truncated,
        coalesce(json_transform(j->'$.counts.dropped', '"MAP(VARCHAR, BIGINT)"'), map())
            as dropped,
        coalesce(json_transform(j->'$.counts.rejected', '"MAP(VARCHAR, BIGINT)"'), map())
            as rejected
    from manifest
),

examples as (
    select
        count(*) filter (where not copy) as written,
        count(*) filter (where copy) as repeated,
        count(*) filter (where truncated and not copy) as truncated,
        coalesce(sum(num_turns_dropped) filter (where not copy), 0)::bigint as turns_dropped
    from (select *, regexp_matches(id, '#[0-9]+$') as copy from read_parquet($data))
),

manifest_dropped as (
    select unnest(map_entries(dropped)) as e
    from counts
),

manifest_rejected as (
    select
        e.key as reason,
        e.value as n
    from (select unnest(map_entries(rejected)) as e from counts)
),

observed_rejected as (
    select
        reason,
        count(*) as n
    from read_parquet($rejects)
    group by reason
),

stages as (
    select 1 as ord, 'read' as stage, null as reason, read as manifest, null::bigint as observed
    from counts
    union all
    select 2, 'written', null, c.written, e.written
    from counts as c, examples as e
    union all
    select 3, 'repeated', null, c.repeated, e.repeated
    from counts as c, examples as e
    where c.repeated is not null or e.repeated > 0
    union all
    select 4, 'truncated', null, c.truncated, e.truncated
    from counts as c, examples as e
    union all
    select 5, 'turns_dropped', null, null, turns_dropped
    from examples
    union all
    select 6, 'dropped', e.key, e.value, null
    from manifest_dropped
    union all
    select 7, 'rejected', coalesce(m.reason, o.reason), m.n, o.n
    from manifest_rejected as m
    full outer join observed_rejected as o
        on o.reason = m.reason
    union all
    select
        8,
        'accounting_gap',
        null,
        (
            read - written
                - coalesce(list_sum(map_values(dropped)), 0)
                - coalesce(list_sum(map_values(rejected)), 0)
        )::bigint,
        null
    from counts
),

final as (
    select
        stage,
        reason,
        manifest,
        observed,
        round(manifest::double / nullif((select read from counts), 0), 4) as share_of_read
    from stages
    order by ord, reason
)

select * from final
