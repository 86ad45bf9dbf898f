"""`etl run`: stream every input file chunk by chunk through the pipeline and write DST.

Per chunk (`etl.pipeline.chunk`): parse + validate (DuckDB, on the prefetch thread) -> plan
turns (Polars lazy, collected once) -> assemble token lists (numpy) -> write `data`, `turns`,
`_rejects` parts. The manifest, with the counts that must add up, is written last.

Start-up: this module imports only what parsing needs. The prefetch thread starts parsing
the first chunk before the per-chunk modules (Polars) are imported and the tokenizer is
loaded, so those ~0.4 s overlap DuckDB's parse (`etl run --timings` shows `startup`).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from etl import columns as c
from etl.cache.apart import check_apart
from etl.cache.parsed import ParsedChunks, open_parsed
from etl.config.run_config import RunConfig
from etl.errors import EtlError
from etl.formats.registry import BuilderQuery, connect, run_builder
from etl.ingest.discover import Source, UnreadableFile, discover, is_uri, source_root
from etl.ingest.prefetch import Prefetch
from etl.ingest.reader import read_chunks, run_first_bytes
from etl.output.card import write_card
from etl.output.ownership import check_inputs, check_target
from etl.output.parquet import REJECTS_SCHEMA, identity_keys
from etl.output.part_writer import PartWriter
from etl.output.writer import OutputWriter
from etl.pipeline.accounting import Counts, Timings
from etl.pipeline.startup import (
    STARTUP,
    builder_query_for,
    preset_template,
    process_age,
    tune_malloc,
)
from etl.ui.progress import Progress

if TYPE_CHECKING:
    from etl.cache.folder import CacheSettings
    from etl.pipeline.chunk import RunState
    from etl.pipeline.resources import Resources

__all__ = ["run"]

# Seconds the main thread waits for the first chunk's parse to start before it loads Polars and
# the tokenizer anyway (input on slow storage: then reading does not hold the GIL).
HEAD_START = 1.0


Item = tuple[Source, pa.Table | UnreadableFile | None, int]


def parsed_chunks(
    sources: list[Source], cfg: RunConfig, query: BuilderQuery, con: duckdb.DuckDBPyConnection, timings: Timings,
    parsing: threading.Event, kept: ParsedChunks | None = None,
) -> Iterator[Item]:
    """(source, parsed chunk, bytes of the file read through it) in file order; an
    `UnreadableFile`, then None, ends each file. `kept`: the token cache's parsed chunks, which
    serve the chunks an earlier run parsed with the same query.

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
                    yield source, parsed, position[0]
            except UnreadableFile as exc:
                yield source, exc, position[0]
            yield source, None, position[0]
    finally:
        parsing.set()  # nothing (more) to parse: the main thread must not wait for it


def _inputs(src: str, out: Path, *, storage: bool) -> tuple[list[Source], list[Path]]:
    """The input files, and the entries of DST that hold them when SRC lies inside DST.

    DST is never read as input: when it lies inside SRC its files are skipped. SRC may be a URI:
    `file://` is its path; another filesystem's (s3://, gs://...) is listed through pyarrow and
    cannot hold DST, a local folder.
    """
    if is_uri(src):
        from etl.ingest.location import local_or_none

        if (path := local_or_none(src)) is None:
            from etl.ingest.objects import discover_objects

            return discover_objects(src), []
        src = path
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


def process(sources: list[Source], parsed: Prefetch[Item], state: RunState, *, progress: bool) -> None:
    """Every chunk of every input through the pipeline, with the write thread and the bar."""
    from etl.pipeline.chunk import process_chunk, reject_file

    total_bytes = sum(s.size() for s in sources)
    counts, parts = state.counts, state.parts
    with parts.background(), Progress(total_bytes=total_bytes, enabled=progress) as bar:
        for source, item, position in parsed:
            if item is None:
                bar.file_done(source.size())
            elif isinstance(item, UnreadableFile):
                reject_file(source, item, counts, parts)
            else:
                process_chunk(source, item, state)
                bar.file_position(position)
                bar.update(counts.read, counts.tokens)


def write_empty_rejects(parts: PartWriter) -> None:
    """DESIGN §4 lists _rejects/part-00000: present, and empty when nothing was rejected."""
    if not parts.count(c.REJECTS_DIR):
        parts.write(c.REJECTS_DIR, REJECTS_SCHEMA.empty_table())


def _resources(config: RunConfig, **early: Any) -> Resources:
    """Import the per-chunk modules (Polars) and load the tokenizer: ~0.4 s with Qwen2.5, which
    `run` spends while the prefetch thread parses the first chunk."""
    from etl.pipeline.resources import build_resources

    return build_resources(config, **early)


def finish(res: Resources, sources: list[Source], counts: Counts, output: OutputWriter,
           config: RunConfig, kept: ParsedChunks | None = None, *, run_id: str, **extra: Any) -> dict[str, Any]:
    """Storage files, the dataset card, and the manifest last (the run is finished only then);
    `kept`: the parsed chunks the token cache served or took; `run_id`: the identity its parts
    carry; `extra`: more top-level keys of the manifest (a mixture's)."""
    from etl.pipeline.resources import manifest_for

    assert counts.add_up(), counts
    res.encoder.close()  # the token cache's new segments, before the manifest that counts them
    manifest = {**manifest_for(res, sources, counts, run_id=run_id), **extra}
    if kept is not None and "token_cache" in manifest:
        manifest["token_cache"]["parsed_chunks"] = kept.summary()
    if config.storage_format != "parquet":  # seed 004's bin/h5 next to the Parquet; numpy-only
        from etl.output.storage import write_run_storage

        manifest["storage"] = write_run_storage(
            output.root, manifest, output, storage_format=config.storage_format,
            max_tokens_per_shard=config.max_tokens_per_shard,
        )
    write_card(output, manifest, weights=res.weights)  # for `datasets.load_dataset(DST)`: lists the parts
    output.commit(manifest)
    return manifest


def _target(dst: str) -> Path:
    """DST's folder: a path, or a file:// URI's path (an object store is refused, saying why)."""
    if is_uri(dst):
        from etl.ingest.location import local_path

        dst = local_path(dst, what="DST")
    out = Path(dst)
    if out.exists() and not out.is_dir():
        raise EtlError(f"DST {dst} is a file; pass a folder (it is created if missing)")
    return out


def prepare(src: str, dst: str, config: RunConfig, *, cache: CacheSettings | None = None,
            ) -> tuple[Path, list[Source], list[Path]]:
    """What both engines check before any work: DST's folder, the token cache apart from SRC and
    DST, SRC's input files, the entries of DST that hold them (`_inputs`), DST writable by etl,
    and h5py when h5 storage is asked for.

    Raises:
        EtlError: in milliseconds, before the tokenizer loads or Ray starts.
    """
    out, (sources,), holds_inputs = prepare_all([src], dst, config, cache=cache)
    return out, sources, holds_inputs


def prepare_all(srcs: list[str], dst: str, config: RunConfig, *, cache: CacheSettings | None = None,
                ) -> tuple[Path, list[list[Source]], list[Path]]:
    """`prepare` for several SRCs (a mixture's sources): the input files of each."""
    out = _target(dst)
    found = [_inputs(src, out, storage=config.storage_format != "parquet") for src in srcs]
    check_apart(cache, srcs, out, tokenizer=config.tokenizer)  # before the cache or DST is made
    holds_inputs = [path for _, holds in found for path in holds]
    check_target(out, keep=holds_inputs)
    if config.storage_format == "h5":  # a missing h5py fails now, not after tokenizing it all
        from etl.output.storage_backends import require_h5py

        require_h5py()
    return out, [sources for sources, _ in found], holds_inputs


def start_parsing(
    config: RunConfig, sources: list[Source], timings: Timings, parsing: threading.Event, *,
    reads: RunConfig | None = None, cache: CacheSettings | None = None, kept: ParsedChunks | None = None,
) -> tuple[Prefetch[Item], Resources]:
    """Start parsing `sources` (as config `reads` says, default `config`: a mixture's first source;
    `kept`: the cache's parsed chunks) on the prefetch thread, then load the run's resources while
    the first chunk parses.

    The first chunk parses (DuckDB, no GIL) while Polars and the tokenizer load (GIL). Reading it
    holds the GIL, so it goes first rather than at half speed beside them.
    """
    reads = config if reads is None else reads
    template = preset_template(config)
    # `hf`: the template needs the tokenizer
    early = None if template is not None else _resources(config, cache=cache)
    con = connect() if early is None else early.con
    if template is not None:
        query = builder_query_for(reads, template)
    else:
        from etl.pipeline.resources import resources_for

        query = resources_for(early, reads).builder_query()
    parsed = Prefetch(parsed_chunks(sources, reads, query, con.cursor(), timings, parsing, kept))
    try:
        parsing.wait(timeout=HEAD_START)
        return parsed, early or _resources(config, template=template, con=con, cache=cache)
    except BaseException:
        parsed.__exit__(None, None, None)  # stop the prefetch thread: the run goes no further
        raise


def run(
    src: str, dst: str, config: RunConfig, *, progress: bool = True, timings: Counter[str] | None = None,
    cache: CacheSettings | None = None,
) -> dict[str, Any]:
    """Run the whole pipeline from SRC to DST; returns the manifest it wrote.

    DST must be new, empty or an earlier etl output; the run holds DST's lock throughout and
    removes only the files the previous manifest (or an interrupted run's journal) lists.
    `timings`, when given, receives wall seconds per stage (kept out of the manifest, which
    must be byte-identical across runs). `cache`: the token cache (None: none; `etl run` passes
    its flags' and environment's, `CacheSettings.resolve`).
    """
    out, sources, holds_inputs = prepare(src, dst, config, cache=cache)
    started = time.perf_counter()
    tune_malloc()
    run_timings = Timings()
    parsing = threading.Event()
    kept = open_parsed(cache, config.tokenizer)
    first, res = start_parsing(config, sources, run_timings, parsing, cache=cache, kept=kept)
    with res.encoder, first as parsed, OutputWriter(out, kind="run", keep=holds_inputs) as output:
        from etl.pipeline.chunk import RunState
        from etl.pipeline.resources import run_identity

        run_id = run_identity(res, sources)  # every part carries it; the manifest records it
        state = RunState(res=res, parts=PartWriter(output, identity=identity_keys(run_id)), timings=run_timings)
        process(sources, parsed, state, progress=progress)
        write_empty_rejects(state.parts)
        manifest = finish(res, sources, state.counts, output, config, kept, run_id=run_id)
    if timings is not None:
        timings.update(state.timings)
        timings["total"] = time.perf_counter() - started
        timings.update(res.encoder.saving())
    return {**manifest, "files": output.files()}

