-- A mixture run's sources: what each one put in the data against the share it was asked for.
-- One row per source, in the manifest's order: its domain(s) (distinct, comma-separated: a
-- source may set several, two sources may share one), examples (data rows, copies included),
-- copies (up-sampled repeats: ids ending in "#k"), tokens, trained_tokens; requested_share from
-- the manifest; realised_share recounted from the data (this source's units / all sources' units,
-- in the manifest's mix_by unit, over every split); difference = realised - requested; and
-- manifest_realised_share, the run's own figure, to cross-check the recount.
-- A source's rows are those whose source_file starts with "<source name>/".
-- Zero rows when the manifest has no `mixture` (an ordinary run of one source).
-- Parameters: $manifest (path of _manifest.json), $data (data files).
with manifest as (
    select content::json as j
    from read_text($manifest)
),

mixture as (
    select
        j->'$.mixture' as m,
        j->>'$.mixture.mix_by' as mix_by
    from manifest
    where json_type(j, '$.mixture') = 'OBJECT'
),

planned as (
    select
        s.key::integer as ord,
        s.value->>'$.name' as source,
        s.value->>'$.domain' as domain,
        (s.value->>'$.requested_share')::double as requested_share,
        (s.value->>'$.realised_share')::double as manifest_realised_share
    from mixture, json_each(m, '$.sources') as s
),

examples as (
    select
        split_part(source_file, '/', 1) as source,
        domain,
        num_tokens,
        num_trained,
        regexp_matches(id, '#[0-9]+$') as is_copy
    from read_parquet($data)
),

observed as (
    select
        source,
        string_agg(distinct domain, ', ' order by domain) as domain,
        count(*) as examples,
        count(*) filter (where is_copy) as copies,
        sum(num_tokens)::bigint as tokens,
        sum(num_trained)::bigint as trained_tokens
    from examples
    group by source
),

-- Manifest sources that kept no row still get a row (zeros): a share of 0 is the finding.
sources as (
    select
        coalesce(p.source, o.source) as source,
        coalesce(o.domain, p.domain) as domain,
        coalesce(o.examples, 0) as examples,
        coalesce(o.copies, 0) as copies,
        coalesce(o.tokens, 0) as tokens,
        coalesce(o.trained_tokens, 0) as trained_tokens,
        p.requested_share,
        p.manifest_realised_share,
        p.ord
    from planned as p
    full outer join observed as o
        on o.source = p.source
),

units as (
    select
        s.*,
        x.mix_by,
        -- an unknown unit gives null shares rather than shares in the wrong unit
        case x.mix_by
            when 'examples' then s.examples
            when 'tokens' then s.tokens
            when 'trained_tokens' then s.trained_tokens
        end::double as units
    -- no mixture: `mixture` is empty, so is this (a plain run's data is not a source list)
    from sources as s, mixture as x
),

final as (
    select
        source,
        domain,
        mix_by,
        examples,
        copies,
        tokens,
        trained_tokens,
        round(requested_share, 4) as requested_share,
        round(units / nullif(sum(units) over (), 0), 4) as realised_share,
        round(units / nullif(sum(units) over (), 0) - requested_share, 4) as difference,
        round(manifest_realised_share, 4) as manifest_realised_share
    from units
    order by ord nulls last, source
)

select * from final
