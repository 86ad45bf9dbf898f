-- How many sequences of length seq_len the data fills, per split:
--   padded_sequences: one example per sequence, padded (examples longer than seq_len are cut);
--   stream_sequences: all tokens concatenated and cut every seq_len tokens (exact, ceil(sum/S));
--   packed_lower_bound: bin packing without splitting examples can never use fewer than
--     max(ceil(sum(min(n, S)) / S), #examples longer than S/2) sequences (two such never share
--     one); first-fit-decreasing lands at or a little above it. It is a bound, not an FFD run.
-- Fill ratios are kept tokens / (sequences * seq_len); packed_fill is an upper bound.
-- Parameters: $data (list of data files), $seq_lens (list of target lengths S).
with examples as (
    select
        split,
        num_tokens
    from read_parquet($data)
),

targets as (
    select unnest($seq_lens::bigint[]) as seq_len
),

sized as (
    select
        e.split,
        t.seq_len,
        count(*) as examples,
        count(*) filter (where e.num_tokens > t.seq_len) as longer_than_seq_len,
        sum(least(e.num_tokens, t.seq_len))::bigint as kept_tokens,
        sum(e.num_tokens)::bigint as tokens,
        count(*) filter (where e.num_tokens * 2 > t.seq_len) as longer_than_half
    from examples as e
    cross join targets as t
    group by e.split, t.seq_len
),

final as (
    select
        split,
        seq_len,
        examples,
        tokens,
        longer_than_seq_len,
        examples as padded_sequences,
        round(kept_tokens::double / (examples * seq_len), 4) as padded_fill,
        ceil(tokens / seq_len)::bigint as stream_sequences,
        greatest(ceil(kept_tokens / seq_len)::bigint, longer_than_half) as packed_lower_bound,
        round(
            kept_tokens::double
                / (greatest(ceil(kept_tokens / seq_len)::bigint, longer_than_half) * seq_len),
            4
        ) as packed_fill
    from sized
    order by split, seq_len
)

select * from final
