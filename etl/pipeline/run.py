"""`etl run`: stream every input file chunk by chunk through the pipeline and write DST.

Per chunk: parse + validate (DuckDB) -> plan turns (Polars lazy, collected once) ->
assemble token lists (numpy) -> write `data`, `turns`, `_rejects` parts. The manifest,
with the counts that must add up, is written last.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from etl import columns as c
from etl.config.run_config import RunConfig
from etl.errors import EtlError
from etl.formats.registry import run_builder
from etl.ingest.discover import Source, UnreadableFile, discover, source_root
from etl.ingest.prefetch import prefetch
from etl.ingest.preprocess import Deduplicator, domains, record_keys, splits
from etl.ingest.reader import read_chunks
from etl.output.card import write_card
from etl.output.ownership import OutputWriter, check_inputs, check_target
from etl.output.parquet import REJECTS_SCHEMA, TURNS_SCHEMA, conform, data_table
from etl.output.part_writer import PartWriter
from etl.pipeline.accounting import Counts, Timings, tally
from etl.pipeline.build import build_examples, records_frame
from etl.pipeline.resources import Resources, build_resources, manifest_for
from etl.ui.progress import Progress

__all__ = ["Resources", "RunState", "build_examples", "build_resources", "records_frame", "run"]

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


Item = tuple[Source, pa.Table | UnreadableFile | None, int]


def _parsed_chunks(sources: list[Source], res: Resources, timings: Timings) -> Iterator[Item]:
    """(source, parsed chunk, bytes of the file read through it) in file order; an
    `UnreadableFile`, then None, ends each file.

    Runs on the prefetch thread, so it has its own DuckDB connection, and it applies
    `preprocessing.max_items` to the raw records (parsing keeps one row per record). The byte
    position travels with its chunk, so the progress bar shows work done, not read ahead.
    """
    cfg = res.config
    query = res.builder_query()
    con = res.con.cursor()
    budget = cfg.max_items
    position = [0]

    def read_through(offset: int) -> None:
        position[0] = offset

    for source in sources:
        if budget == 0:
            return
        position[0] = 0
        try:
            for raw in read_chunks(source, chunk_bytes=cfg.chunk_bytes, progress=read_through):
                if budget is not None:  # preprocessing.max_items: stop reading there
                    raw = raw.slice(0, budget)
                    budget -= raw.num_rows
                    if raw.num_rows == 0:
                        break
                with timings.timed("parse"):  # on the prefetch thread: overlaps tokenizing
                    parsed = run_builder(con, raw, query)
                yield source, parsed, position[0]
        except UnreadableFile as exc:
            yield source, exc, position[0]
        yield source, None, position[0]


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


def process_chunk(source: Source, parsed: pa.Table, state: RunState) -> None:
    """Preprocess, plan, assemble and write one parsed chunk of one file; update the counts."""
    res, counts, timings = state.res, state.counts, state.timings
    cfg = res.config
    counts.read += parsed.num_rows
    counts.read_per_file[source.name] += parsed.num_rows
    good = _split_parsed(parsed, source, counts, state.parts)
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
    records = records_frame(
        source.name, good, domain=domains(good), split=splits(draws, cfg.val_fraction)
    )
    examples, plan = build_examples(records, res, timings)
    dropped = examples.with_columns(
        pl.coalesce(
            pl.col(c.DROP_REASON), pl.when(pl.col(c.NUM_TRAINED) == 0).then(pl.lit(NO_TRAINED))
        ).alias("why")
    )
    tally(counts.dropped, dropped["why"].drop_nulls().to_arrow())
    with timings.timed("write"):
        kept = dropped.filter(pl.col("why").is_null())
        _write_examples(kept, plan, counts, state.parts, weights=res.weights)


def _write_examples(
    examples: pl.DataFrame, plan: pl.DataFrame, counts: Counts, parts: PartWriter, *, weights: bool
) -> None:
    counts.written += examples.height
    counts.truncated += int(examples[c.TRUNCATED].sum())
    counts.tokens += int(examples[c.NUM_TOKENS].sum())
    counts.trained_tokens += int(examples[c.NUM_TRAINED].sum())
    turns = plan.join(
        examples.select(c.CONV, c.ID, c.SPLIT), on=c.CONV, how="inner", maintain_order="left"
    )
    turns = turns.with_columns(pl.col(c.TURN_LEN).alias(c.NUM_TOKENS))
    for split in sorted(examples[c.SPLIT].unique().to_list()):
        data = data_table(examples.filter(pl.col(c.SPLIT) == split).to_arrow(), weights=weights)
        parts.write(f"{c.DATA_DIR}/{split}", data)
        parts.write(f"{c.TURNS_DIR}/{split}", conform(turns.filter(pl.col(c.SPLIT) == split).to_arrow(), TURNS_SCHEMA))


def _reject_file(source: Source, exc: UnreadableFile, counts: Counts, parts: PartWriter) -> None:
    """A file (or folder) that cannot be read, or not to its end, counts as one rejected record
    (line -1) and is listed in the manifest's `incomplete_inputs` with how much of it was kept."""
    counts.read += 1
    counts.rejected[exc.reason] += 1
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


def _inputs(src: str, out: Path, *, storage: bool) -> tuple[list[Source], list[Path]]:
    """The input files, and the entries of DST that hold them when SRC lies inside DST.

    DST is never read as input: when it lies inside SRC its files are skipped.
    """
    root = source_root(src)
    src_inside = check_inputs(out, root, storage=storage)
    sources = discover(src)
    if src_inside:
        return sources, [out / root.resolve().relative_to(out.resolve()).parts[0]]
    dst = out.resolve()
    sources = [s for s in sources if dst not in s.path.resolve().parents]
    if not sources:
        raise EtlError(f"no input files in {src} besides etl's own output in {out}")
    return sources, []


def _process(sources: list[Source], state: RunState, *, progress: bool) -> None:
    """Every chunk of every input through the pipeline, with the write thread and the bar."""
    total_bytes = sum(s.path.stat().st_size for s in sources if s.kind != "dir")
    counts, parts = state.counts, state.parts
    with parts.background(), Progress(total_bytes=total_bytes, enabled=progress) as bar:
        for source, item, position in prefetch(_parsed_chunks(sources, state.res, state.timings)):
            if item is None:
                bar.file_done(source.path.stat().st_size if source.kind != "dir" else 0)
            elif isinstance(item, UnreadableFile):
                _reject_file(source, item, counts, parts)
            else:
                process_chunk(source, item, state)
                bar.file_position(position)
                bar.update(counts.read, counts.tokens)
        if not parts.count(c.REJECTS_DIR):  # DESIGN §4 lists _rejects/part-00000: present, empty
            parts.write(c.REJECTS_DIR, REJECTS_SCHEMA.empty_table())


def run(
    src: str, dst: str, config: RunConfig, *, progress: bool = True, timings: Counter[str] | None = None
) -> dict[str, Any]:
    """Run the whole pipeline from SRC to DST; returns the manifest it wrote.

    DST must be new, empty or an earlier etl output; the run holds DST's lock throughout and
    removes only the files the previous manifest (or an interrupted run's journal) lists.
    `timings`, when given, receives wall seconds per stage (kept out of the manifest, which
    must be byte-identical across runs).
    """
    out = Path(dst)
    if out.exists() and not out.is_dir():
        raise EtlError(f"DST {dst} is a file; pass a folder (it is created if missing)")
    storage = config.storage_format != "parquet"
    sources, holds_inputs = _inputs(src, out, storage=storage)
    check_target(out, keep=holds_inputs)  # before the tokenizer loads: refuse in milliseconds
    if config.storage_format == "h5":  # a missing h5py fails now, not after tokenizing it all
        from etl.output.storage_backends import require_h5py

        require_h5py()
    res = build_resources(config)
    started = time.perf_counter()
    with OutputWriter(out, kind="run", keep=holds_inputs) as output:
        state = RunState(res=res, parts=PartWriter(output))
        _process(sources, state, progress=progress)
        assert state.counts.add_up(), state.counts
        manifest = manifest_for(res, sources, state.counts)
        if storage:  # seed 004's bin/h5 next to the Parquet; numpy-only, imported when asked
            from etl.output.storage import write_run_storage

            manifest["storage"] = write_run_storage(
                out, manifest, output, storage_format=config.storage_format,
                max_tokens_per_shard=config.max_tokens_per_shard,
            )
        write_card(output, manifest, weights=res.weights)  # for `datasets.load_dataset(DST)`: lists the parts
        output.commit(manifest)
    if timings is not None:
        timings.update(state.timings)
        timings["total"] = time.perf_counter() - started
    return {**manifest, "files": output.files()}

