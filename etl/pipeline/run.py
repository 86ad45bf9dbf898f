"""`etl run` on this machine: the local engine, and `run`, a plain run on it.

Per chunk (`etl.pipeline.chunk`): parse + validate (DuckDB, on the prefetch thread) -> plan
turns (Polars lazy, collected once) -> assemble token lists (numpy) -> write `data`, `turns`,
`_rejects` parts. The driver (`etl.pipeline.driver`) writes the manifest, with the counts that
must add up, last.

Start-up: this module imports only what parsing needs. The prefetch thread starts parsing
the first chunk before the per-chunk modules (Polars) are imported and the tokenizer is
loaded, so those overlap DuckDB's parse (`etl run --timings` shows `startup`; docs/design.md,
Start-up).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from etl.cache.parsed import ParsedChunks, open_parsed
from etl.config.run_config import RunConfig, RunSettings, RunSource
from etl.formats.builders import BuilderQuery, connect, run_builder
from etl.ingest.discover import Source, UnreadableFile
from etl.ingest.prefetch import Prefetch
from etl.ingest.reader import read_chunks, run_first_bytes
from etl.output.part_writer import PartWriter, StagedParts
from etl.pipeline.accounting import Counts, Timings
from etl.pipeline.driver import drive
from etl.pipeline.startup import STARTUP, builder_query_for, process_age, tune_malloc
from etl.ui.progress import Progress

if TYPE_CHECKING:
    from etl.cache.folder import CacheSettings
    from etl.images.workers import ImageWorkers
    from etl.pipeline.chunk import RunState
    from etl.pipeline.plan import RunPlan
    from etl.pipeline.resources import Resources
    from etl.tokens.tokenizer import TextTokenizer

__all__ = ["LocalEngine", "run"]

# Seconds the main thread waits for the first chunk's parse to start before it loads Polars and
# the tokenizer anyway (input on slow storage: then reading does not hold the GIL).
HEAD_START = 1.0


# (source, its parsed chunk, or the reason it cannot be read, or None at its end; bytes of the file
# read through it; what `early` started for the chunk, e.g. its images' reads, or None)
Item = tuple[Source, pa.Table | UnreadableFile | None, int, Any]


def parsed_chunks(
    sources: list[Source], cfg: RunConfig, query: BuilderQuery, con: duckdb.DuckDBPyConnection, timings: Timings,
    parsing: threading.Event, kept: ParsedChunks | None = None,
    early: Callable[[str, pa.Table], Any] | None = None,
) -> Iterator[Item]:
    """(source, parsed chunk, bytes of the file read through it, `early(source path, chunk)`) in file
    order; an `UnreadableFile`, then None, ends each file. `kept`: the token cache's parsed chunks,
    which serve the chunks an earlier run parsed with the same query.

    Runs on the prefetch thread, so it takes its own DuckDB cursor; sets `parsing` when the
    first parse starts (or when there is none to start), and it applies
    `preprocessing.max_items` to the raw records (parsing keeps one row per record). The byte
    position travels with its chunk, so the progress bar shows work done, not read ahead.
    """
    budget = cfg.max_items
    position = [0]
    parse = run_builder if kept is None else kept.parse

    def read_through(offset: int) -> None:
        position[0] = offset

    try:
        for index, source in enumerate(sources):
            if budget == 0:
                return
            position[0] = 0
            first = run_first_bytes(index, cfg.chunk_bytes)
            try:
                for raw in read_chunks(source, chunk_bytes=cfg.chunk_bytes, progress=read_through, first_bytes=first):
                    if budget is not None:  # preprocessing.max_items: stop reading there
                        raw = raw.slice(0, budget)
                        budget -= raw.num_rows
                        if raw.num_rows == 0:
                            break
                    if not parsing.is_set():
                        timings[STARTUP] = process_age() or 0.0
                        parsing.set()
                    with timings.timed("parse"):  # on the prefetch thread: overlaps tokenizing
                        parsed = parse(con, raw, query)
                    yield source, parsed, position[0], early and early(str(source.path), parsed)
            except UnreadableFile as exc:
                yield source, exc, position[0], None
            yield source, None, position[0], None
    finally:
        parsing.set()  # nothing (more) to parse: the main thread must not wait for it


def process(sources: list[Source], parsed: Prefetch[Item], state: RunState, *, progress: bool) -> None:
    """Every chunk of every input through the pipeline, with the write thread and the bar."""
    # polars: imported while the first chunk parses
    from etl.pipeline.chunk import process_chunk, reject_file

    total_bytes = sum(s.size() for s in sources)
    counts, parts = state.counts, state.parts
    with parts.background(), Progress(total_bytes=total_bytes, enabled=progress) as bar:
        for source, item, position, started in parsed:
            if item is None:
                bar.file_done(source.size())
            elif isinstance(item, UnreadableFile):
                reject_file(source, item, counts, parts)
            else:
                process_chunk(source, item, state, started)
                bar.file_position(position)
                bar.update(counts.read, counts.tokens)


def _start_parsing(
    plan: RunPlan, files: list[Source], timings: Timings, parsing: threading.Event, *,
    tokenizer: TextTokenizer | None, cache: CacheSettings | None, kept: ParsedChunks | None,
    workers: ImageWorkers | None = None,
) -> tuple[Prefetch[Item], Resources]:
    """Start parsing the first source's `files` (`kept`: the cache's parsed chunks) on the prefetch
    thread, then load the run's resources while the first chunk parses.

    The first chunk parses (DuckDB, no GIL) while Polars and the tokenizer load (GIL). Reading it
    holds the GIL, so it goes first rather than at half speed beside them.
    """
    con = connect()
    reads = plan.sources[0].config
    query = builder_query_for(reads, plan.template)
    parsed = Prefetch(parsed_chunks(files, reads, query, con.cursor(), timings, parsing, kept,
                                    _early(reads, workers)))
    try:
        parsing.wait(timeout=HEAD_START)
        # polars: imported while the first chunk parses
        from etl.pipeline.resources import build_resources

        return parsed, build_resources(plan, tokenizer=tokenizer, con=con, cache=cache)
    except BaseException:
        parsed.__exit__(None, None, None)  # stop the prefetch thread: the run goes no further
        raise


def _image_workers(config: RunConfig, input_bytes: int) -> contextlib.AbstractContextManager[Any]:
    """The run's image worker processes (`etl.images.workers`) when its tokenizer folder has an
    image processor (closed on leaving); else nothing. Started before the first chunk's parse, so
    they start beside it."""
    from etl.images.vision import has_vision

    if not has_vision(config.tokenizer):
        return contextlib.nullcontext()
    from etl.images.workers import ImageWorkers

    return ImageWorkers.start(input_bytes) or contextlib.nullcontext()


def _early(config: RunConfig, workers: ImageWorkers | None) -> Callable[[str, pa.Table], Any] | None:
    """What the prefetch thread starts for each parsed chunk: its images' reads in the workers."""
    if workers is None:
        return None
    from etl.pipeline.image_read import early_reads

    return functools.partial(early_reads, root=config.image_root, embed=config.images == "embed", workers=workers)


class LocalEngine:
    """Maps chunks to parts in this process: each source's files parsed on the prefetch thread,
    planned and assembled on the main thread, their parts written on a background thread."""

    def __init__(self) -> None:
        self.kept: ParsedChunks | None = None
        self.timings = Timings()
        self.parsing = threading.Event()  # set once: `startup` is the first source's first parse
        self.first: Prefetch[Item] | None = None

    def paths(self, out: Path, files: list[list[Source]]) -> tuple[Path, list[list[Source]]]:
        return out, files

    @contextlib.contextmanager
    def start(self, plan: RunPlan, files: list[list[Source]], timings: Timings, *, tokenizer: TextTokenizer | None,
              cache: CacheSettings | None, progress: bool) -> Iterator[Resources]:
        """Parse the first source's first chunk while the tokenizer loads; close the token cache
        when leaving, even on an error (what a failed run tokenized is still right)."""
        tune_malloc()
        self.timings = timings
        self.kept = open_parsed(cache, plan.config.tokenizer)
        size = sum(s.size() for fs in files for s in fs)
        with _image_workers(plan.config, size) as workers:
            self.first, res = _start_parsing(plan, files[0], timings, self.parsing, tokenizer=tokenizer, cache=cache,
                                             kept=self.kept, workers=workers)
            res = dataclasses.replace(res, image_workers=workers)
            with res.encoder, self.first:
                if hasattr(res.tokenizer, "plan"):  # the tokenizer backend, by the run's input size
                    res.tokenizer.plan(size)
                yield res
        timings.update(res.encoder.saving())  # `--timings`: the seconds the token cache saved

    def map_chunks(self, sources: tuple[RunSource, ...], files: list[list[Source]], res: Resources, parts: PartWriter, *,
                   progress: bool) -> list[Counts]:
        from etl.pipeline.chunk import RunState  # Polars: imported while the first chunk parses

        # Dedup (when asked) and the once-per-run warnings span every source of a mixture.
        state = RunState(res=res, parts=parts, timings=self.timings)
        return [self._map_source(index, source, fs, state, progress=progress)
                for index, (source, fs) in enumerate(zip(sources, files, strict=True))]

    def _map_source(self, index: int, source: RunSource, files: list[Source], state: RunState, *,
                    progress: bool) -> Counts:
        """One source's chunks through the pipeline with its own config and domain; its counts."""
        # polars: imported while the first chunk parses
        from etl.pipeline.resources import resources_for

        res = resources_for(state.res, source)
        if isinstance(state.parts, StagedParts):
            state.parts.prefix = source.name  # a mixture stages each source's parts apart
        mine = dataclasses.replace(state, res=res, counts=Counts(), domain=source.domain)
        parsed = self.first if index == 0 else Prefetch(parsed_chunks(
            files, source.config, res.builder_query(), res.con.cursor(), self.timings, self.parsing, self.kept,
            _early(source.config, res.image_workers)))
        assert parsed is not None
        with parsed as items:
            process(files, items, mine, progress=progress)
        return mine.counts


def run(
    src: str, dst: str, config: RunConfig, *, progress: bool = True, timings: Counter[str] | None = None,
    cache: CacheSettings | None = None,
) -> dict[str, Any]:
    """Run the whole pipeline from SRC to DST on this machine; returns the manifest it wrote
    (`etl.pipeline.driver.drive`, whose `timings` and `cache` these are)."""
    return drive(RunSettings.one(src, dst, config), LocalEngine(), progress=progress, timings=timings, cache=cache)
