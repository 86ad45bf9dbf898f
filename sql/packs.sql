-- The pack index `etl pack` wrote, per split and strategy, read back from its Parquet parts:
-- packs, examples (distinct rows with a piece), pieces, tokens, utilization = tokens / (packs *
-- seq_len), docs per pack (distinct examples in one pack: mean, min, max), and from _packs.json
-- the examples a whole-example packer clipped to seq_len, the examples' tokens no pack holds
-- (skipped_tokens: clipped tails, the tails stream skips) and stream_utilization = the share of
-- the examples' tokens some pack holds (stream at a small S: utilization 1.0, most tokens skipped).
-- No rows when DST has no pack index (`etl pack DST --strategy bfd` writes one).
-- Parameters: $packs (pack index parts DST/packs/<split>/part-*.parquet), $packs_record (path of
-- _packs.json: strategy, seq_len, clipped, skipped_tokens and stream_utilization per split).
with record as (
    select content::json as j
    from read_text($packs_record)
),

settings as (
    select
        e.key as split,
        e.value->>'$.strategy' as strategy,
        (e.value->>'$.seq_len')::bigint as seq_len,
        (e.value->>'$.clipped')::bigint as clipped,
        (e.value->>'$.skipped_tokens')::bigint as skipped_tokens,
        round((e.value->>'$.stream_utilization')::double, 6) as stream_utilization
    from (
        select unnest(map_entries(json_transform(j->'$.splits', '"MAP(VARCHAR, JSON)"'))) as e
        from record
    )
),

packs as (
    select
        regexp_extract(filename, '/([^/]+)/[^/]+\.parquet$', 1) as split,
        num_tokens,
        len(list_distinct(rows)) as docs,
        len(rows) as pieces,
        rows
    from read_parquet($packs, filename = true)
),

per_split as (
    select
        split,
        count(*) as packs,
        sum(pieces)::bigint as pieces,
        sum(num_tokens)::bigint as tokens,
        round(avg(docs), 2) as mean_docs,
        min(docs) as min_docs,
        max(docs) as max_docs
    from packs
    group by split
),

examples as (
    select
        split,
        count(distinct row) as examples
    from (select split, unnest(rows) as row from packs)
    group by split
),

final as (
    select
        p.split,
        s.strategy,
        s.seq_len,
        p.packs,
        x.examples,
        p.pieces,
        p.tokens,
        round(p.tokens::double / (p.packs * s.seq_len), 6) as utilization,
        p.mean_docs,
        p.min_docs,
        p.max_docs,
        s.clipped,
        s.skipped_tokens,
        s.stream_utilization
    from per_split as p
    join settings as s on s.split = p.split
    join examples as x on x.split = p.split
    order by p.split
)

select * from final
