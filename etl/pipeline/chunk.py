"""One parsed chunk of one input file through the pipeline: rejects, dedup and split, plan
(Polars), assemble (numpy), write the `data`, `turns` and `_rejects` parts, and count it all.

`etl.pipeline.run` imports this module only after the first chunk's parse has started: importing
Polars and loading the tokenizer then overlap DuckDB's parse, which runs without the GIL
(docs/design.md, Start-up).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from etl import columns as c
from etl.ingest.discover import READ_ELSEWHERE, Source, UnreadableFile
from etl.ingest.preprocess import Deduplicator, domains, record_keys, splits
from etl.kinds import PREFERENCE, SFT, UNPAIRED, kind_of
from etl.output.parquet import REJECTS_SCHEMA, TURNS_SCHEMA, conform, data_table
from etl.output.part_writer import PartWriter
from etl.pipeline.accounting import Counts, Timings, tally
from etl.pipeline.build import build_examples, records_frame
from etl.pipeline.image_read import IMAGE_DATA, Started, read_chunk_images
from etl.pipeline.images import (
    example_images,
    flat_images,
    image_parts,
    with_images,
)
from etl.pipeline.joins import control_texts, spells_control
from etl.pipeline.pairs import write_pairs
from etl.pipeline.resources import Resources
from etl.pipeline.truncation import headers_cut

NO_TRAINED = "no_trained_tokens"
DUPLICATE = "duplicate"
DROP_PREFIX = "drop:"  # builder reasons that are drops (e.g. text too short), not rejects


def _rejects_table(source: Source, table: pa.Table) -> pa.Table:
    n = table.num_rows
    return conform(
        table.append_column(c.SOURCE_FILE, pa.array([source.name] * n, pa.string())), REJECTS_SCHEMA
    )


@dataclass
class RunState:
    """What changes as the chunks go through: each step below takes only the parts it updates."""

    res: Resources
    parts: PartWriter
    counts: Counts = field(default_factory=Counts)
    timings: Timings = field(default_factory=Timings)
    dedup: Deduplicator = field(default_factory=Deduplicator)
    warned: set[str] = field(default_factory=set)  # warnings printed once per run
    domain: str = c.DEFAULT_DOMAIN  # of records without a domain key's value (a mixture: the source's)


def _split_parsed(parsed: pa.Table, source: Source, counts: Counts, parts: PartWriter) -> pa.Table:
    """Count and write rejects, count builder drops; return the good rows."""
    reason = parsed.column(c.REASON)
    if reason.null_count == len(reason):  # the usual chunk: all good, no copy of its messages
        return parsed
    is_drop = pc.fill_null(pc.starts_with(reason, DROP_PREFIX), False)
    bad = parsed.filter(pc.and_(reason.is_valid(), pc.invert(is_drop)))
    tally(
        counts.dropped,
        pc.utf8_slice_codeunits(parsed.filter(is_drop).column(c.REASON), len(DROP_PREFIX)),
    )
    if bad.num_rows:
        tally(counts.rejected, bad.column(c.REASON))
        parts.write(c.REJECTS_DIR, _rejects_table(source, bad))
    return parsed.filter(reason.is_null())


def _warn_unwritten_weights(good: pa.Table, res: Resources, warned: set[str]) -> None:
    """Records carry per-message weights but no `loss_weight` column is written: say so once.

    (A weight of 0 still un-trains its message; other weights need input.weight_key.)
    """
    if res.weights or "weights" in warned or "messages" not in good.column_names:
        return
    messages = pc.list_flatten(good.column("messages"))
    fields = {f.name for f in messages.type}
    if "weight" in fields and pc.any(pc.is_valid(pc.struct_field(messages, "weight"))).as_py():
        warned.add("weights")
        print(
            "etl run: warning: records carry per-message weights; set input.weight_key in a "
            "config to write them as loss_weight (a weight of 0 still leaves its message untrained)",
            file=sys.stderr,
        )


def process_chunk(source: Source, parsed: pa.Table, state: RunState, started: list[Started] | None = None) -> None:
    """Preprocess, plan, assemble and write one parsed chunk of one file; update the counts.
    `started`: its images' reads, started when it was parsed (`etl.pipeline.image_read.early_reads`)."""
    res, counts, timings = state.res, state.counts, state.timings
    cfg = res.config
    counts.read += parsed.num_rows
    counts.read_per_file[source.name] += parsed.num_rows
    good = _split_parsed(parsed, source, counts, state.parts)
    slices = read_chunk_images(good, source_path=str(source.path), rule=res.vision, root=cfg.image_root,
                               embed=cfg.images == "embed", seq_len=cfg.seq_len, workers=res.image_workers,
                               started=started)
    for kept, bad_images in _timed(slices, timings) if res.vision else slices:
        if bad_images is not None:
            tally(counts.rejected, bad_images.column(c.REASON))
            state.parts.write(c.REJECTS_DIR, _rejects_table(source, bad_images))
        _process_good(source, kept, state)


def _timed(items: Iterator[Any], timings: Timings) -> Iterator[Any]:
    """`items`, each one's production timed as `images`."""
    while True:
        with timings.timed("images"):
            item = next(items, None)
        if item is None:
            return
        yield item


def _process_good(source: Source, good: pa.Table, state: RunState) -> None:
    """Dedup, split and write the good records of one chunk (or of one slice of an image chunk)."""
    res, counts, timings = state.res, state.counts, state.timings
    cfg = res.config
    _warn_unwritten_weights(good, res, state.warned)
    if good.num_rows == 0:
        return
    draws = np.zeros(good.num_rows)
    if cfg.deduplicate or cfg.val_fraction > 0:  # one more pass over the text: only when asked
        with timings.timed("dedup_split"):
            keys, draws = record_keys(
                res.con, good, source=source.name, exact=cfg.dedup_mode == "exact", split_seed=cfg.split_seed
            )
        if cfg.deduplicate:
            fresh = state.dedup.keep(keys)
            counts.dropped[DUPLICATE] += int((~fresh).sum())
            good, draws = good.filter(pa.array(fresh)), draws[fresh]
            if good.num_rows == 0:
                return
    CHUNK_WRITERS[kind_of(cfg.input_type).name](source, good, splits(draws, cfg.val_fraction), state)


def _write_pair_chunk(source: Source, good: pa.Table, split: pa.Array, state: RunState) -> None:
    """Plan, fit and write one chunk's pairs (or unpaired completions) and their rejects."""
    with state.timings.timed("pairs"):
        bad = write_pairs(source.name, good, domains(good, state.domain), split, res=state.res,
                          counts=state.counts, parts=state.parts, timings=state.timings)
    if bad is not None:
        state.parts.write(c.REJECTS_DIR, _rejects_table(source, bad))


def _write_sft_chunk(source: Source, good: pa.Table, split: pa.Array, state: RunState) -> None:
    """Plan and assemble one chunk's examples; write them and their turns, count the drops."""
    res, counts, timings = state.res, state.counts, state.timings
    records = records_frame(source.name, good, domain=domains(good, state.domain), split=split)
    examples, plan = build_examples(records, res, timings)
    images = flat_images(good) if IMAGE_DATA in good.column_names else None
    if images is not None:
        examples = with_images(examples, example_images(records, plan))
    spelled = records.filter(spells_control(records, control_texts(res.tokenizer)))[c.CONV]
    dropped = examples.with_columns(
        pl.coalesce(
            pl.col(c.DROP_REASON), pl.when(pl.col(c.NUM_TRAINED) == 0).then(pl.lit(NO_TRAINED))
        ).alias("why")
    )
    why = dropped["why"].drop_nulls()
    tally(counts.dropped, why.to_arrow())
    with timings.timed("write"):
        kept = dropped.filter(pl.col("why").is_null()) if len(why) else dropped  # a filter copies the ids
        counts.special_text += int(kept[c.CONV].is_in(spelled.implode()).sum()) if len(spelled) else 0
        _write_examples(kept, plan, counts, state.parts, weights=res.weights, images=images,
                        embed=res.config.images == "embed")


# The chunk writer of each kind of row (etl.kinds.KINDS).
CHUNK_WRITERS = {SFT: _write_sft_chunk, PREFERENCE: _write_pair_chunk, UNPAIRED: _write_pair_chunk}


def _write_examples(
    examples: pl.DataFrame, plan: pl.DataFrame, counts: Counts, parts: PartWriter, *, weights: bool,
    images: pa.StructArray | None = None, embed: bool = False,
) -> None:
    counts.written += examples.height
    counts.truncated += int(examples[c.TRUNCATED].sum())
    counts.tokens += int(examples[c.NUM_TOKENS].sum())
    counts.trained_tokens += int(examples[c.NUM_TRAINED].sum())
    turns = plan.join(
        examples.select(c.CONV, c.ID, c.SPLIT), on=c.CONV, how="inner", maintain_order="left"
    )
    turns = turns.with_columns(pl.col(c.TURN_LEN).alias(c.NUM_TOKENS))
    counts.header_cut += headers_cut(turns)
    names = sorted(examples[c.SPLIT].unique().to_list())
    for split in names:
        # One split (no val fraction): the chunk as it is, without a filter's copy of its ids.
        rows = examples if len(names) == 1 else examples.filter(pl.col(c.SPLIT) == split)
        tables = [rows.to_arrow()] if images is None else image_parts(rows.to_arrow(), images, embed=embed)
        for table in tables:
            parts.write(f"{c.DATA_DIR}/{split}", data_table(table, weights=weights, images=images is not None))
        split_turns = turns if len(names) == 1 else turns.filter(pl.col(c.SPLIT) == split)
        parts.write(f"{c.TURNS_DIR}/{split}", conform(split_turns.to_arrow(), TURNS_SCHEMA))


def reject_file(source: Source, exc: UnreadableFile, counts: Counts, parts: PartWriter) -> None:
    """A file (or folder) that cannot be read, or not to its end, counts as one rejected record
    (line -1) and is listed in the manifest's `incomplete_inputs` with how much of it was kept.
    A path not followed because what it leads to is read under another (`READ_ELSEWHERE`) is
    counted the same way but loses nothing, so it is not listed."""
    counts.read += 1
    counts.rejected[exc.reason] += 1
    if exc.reason not in READ_ELSEWHERE:
        counts.incomplete.append(
            {"path": source.name, "reason": exc.reason, "records_read": counts.read_per_file[source.name],
             "error": str(exc)}
        )
    table = pa.table(
        {
            c.SOURCE_LINE: pa.array([-1], pa.int64()),
            c.REASON: [exc.reason],
            c.DETAIL: [str(exc)],
            c.RAW: [None],
        }
    )
    parts.write(c.REJECTS_DIR, _rejects_table(source, table))
