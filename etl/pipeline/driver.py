"""The one run driver: a plain run, a mixture and a run on Ray all go through `drive`.

A run is its settings (`RunSettings`: DST and a list of sources, a plain run being a mixture of
one) and an engine that maps their chunks to parts (`LocalEngine` in `etl.pipeline.run`, `RayEngine` in `etl.engine.ray_run`).
`drive` takes the same four steps for every run:

1. prepare: DST's folder, each source's input files, the token cache apart from both, DST
   writable by etl; an error here comes in milliseconds, before the tokenizer loads or Ray starts;
2. plan and start: the run's plan is resolved once (etl.pipeline.plan: the template chosen, every
   source's config resolved), then the engine loads the run's resources (the local engine parses
   the first chunk meanwhile);
3. map: under DST's lock, the engine runs every chunk of every source through the pipeline into
   parts: in place, or staged when a second pass (a mixture's) reads them back and rewrites them;
4. finish: the second pass, the empty rejects part, the dataset card, and the manifest last: the
   run is finished only then (a crash before it leaves the journal, and the next run cleans up).

The driver gets finished, frozen settings; it reads no flags and no config files.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from etl import columns as c
from etl.arrow_values import empty_table
from etl.cache.apart import check_apart
from etl.config.run_config import RunConfig, RunSettings, RunSource
from etl.errors import EtlError
from etl.ingest.discover import Source, discover, is_uri, source_root
from etl.ingest.location import local_or_none, local_path
from etl.ingest.objects import discover_objects
from etl.output.card import write_card
from etl.output.ownership import check_inputs, check_target
from etl.output.parquet import REJECTS_SCHEMA, identity_keys
from etl.output.part_writer import PartWriter, StagedParts
from etl.output.writer import OutputWriter
from etl.pipeline.accounting import Counts, Timings
from etl.pipeline.plan import RunPlan, load_plan
from etl.safe_paths import check_no_symlink

if TYPE_CHECKING:
    import duckdb

    from etl.cache.folder import CacheSettings
    from etl.cache.parsed import ParsedChunks
    from etl.pipeline.resources import Resources
    from etl.tokens.tokenizer import TextTokenizer

__all__ = ["SecondPass", "drive"]


class _Engine(Protocol):
    """What maps a run's chunks to parts: this process (`LocalEngine`) or a Ray cluster (`RayEngine`)."""

    kept: ParsedChunks | None  # the token cache's parsed chunks it served or took (the manifest counts them)

    def paths(self, out: Path, files: list[list[Source]]) -> tuple[Path, list[list[Source]]]:
        """DST and the input files as the engine's workers open them."""
        ...

    def start(self, plan: RunPlan, files: list[list[Source]], timings: Timings, *, tokenizer: TextTokenizer | None,
              cache: CacheSettings | None, progress: bool) -> AbstractContextManager[Resources]:
        """Load the run's resources (`tokenizer`: loaded with the plan already) and start on the
        first source; leaving it stops what it started."""
        ...

    def map_chunks(self, sources: tuple[RunSource, ...], files: list[list[Source]], res: Resources, parts: PartWriter, *,
                   progress: bool) -> list[Counts]:
        """Every chunk of every source through the pipeline into `parts`; each source's counts."""
        ...


# A mixture's second pass: (the staged parts, each source's counts, DuckDB, DST's parts) ->
# (the manifest's `mixture` section, the run's counts).
SecondPass = Callable[[StagedParts, list[Counts], "duckdb.DuckDBPyConnection", PartWriter],
                      tuple[dict[str, Any], Counts]]


def drive(
    settings: RunSettings, engine: _Engine, *, mix: SecondPass | None = None, progress: bool = True,
    timings: Counter[str] | None = None, cache: CacheSettings | None = None,
) -> dict[str, Any]:
    """Run `settings` (its sources into its DST) on `engine` (`mix`: a mixture's second pass);
    returns the manifest it wrote, with its `files`.

    DST must be new, empty or an earlier etl output; the run holds DST's lock throughout and
    removes only the files the previous manifest (or an interrupted run's journal) lists.
    `timings`, when given, receives wall seconds per stage (kept out of the manifest, which must
    be byte-identical across runs). `cache`: the token cache (None: none; `etl run` passes its
    flags' and environment's, `CacheSettings.resolve`).
    """
    sources = settings.sources
    out, found, holds_inputs = prepare([s.path for s in sources], settings.dst, settings.config, cache=cache)
    out, files = engine.paths(out, [s.named(fs) for s, fs in zip(sources, found, strict=True)])
    started = time.perf_counter()
    # Lazy even without a cache: tokenizer.json is parsed at the first question the template did not
    # need, in build_resources, beside the first chunk's parse (Qwen2.5's: ~0.27 s of start-up).
    plan, tokenizer = load_plan(settings, lazy=True)
    inputs = [f for fs in files for f in fs]
    run_timings = Timings()
    with (engine.start(plan, files, run_timings, tokenizer=tokenizer, cache=cache, progress=progress) as res,
          OutputWriter(out, kind="run", keep=holds_inputs) as output):
        # polars (via etl.pipeline.resources): off `etl run`'s start-up imports
        from etl.pipeline.resources import run_identity

        run_id = run_identity(res, inputs)  # every part carries it (the staged ones too); the manifest records it
        identity = identity_keys(run_id)
        parts = (PartWriter(output, identity=identity) if mix is None
                 else StagedParts(output, output.staging(), identity=identity))
        per_source = engine.map_chunks(plan.sources, files, res, parts, progress=progress)
        extra: dict[str, Any] = {}
        if mix is None:
            counts = Counts()
            for part in per_source:
                counts.add(part)
        else:
            with run_timings.timed("mix"):
                extra["mixture"], counts = mix(parts, per_source, res.con, PartWriter(output, identity=identity))
        _write_empty_rejects(parts)
        if isinstance(parts, StagedParts):  # journaled: a crash before this leaves it for the next run to remove
            shutil.rmtree(check_no_symlink(parts.staging, output.root))
        manifest = finish(res, inputs, counts, output, engine.kept, run_id=run_id, **extra)
    if timings is not None:
        timings.update(run_timings)
        timings["total"] = time.perf_counter() - started
    return {**manifest, "files": output.files()}


def _write_empty_rejects(parts: PartWriter) -> None:
    """The output's layout has _rejects/part-00000: present, and empty when nothing was rejected."""
    if not parts.count(c.REJECTS_DIR):
        parts.write(c.REJECTS_DIR, empty_table(REJECTS_SCHEMA))


def finish(res: Resources, inputs: list[Source], counts: Counts, output: OutputWriter,
           kept: ParsedChunks | None = None, *, run_id: str, **extra: Any) -> dict[str, Any]:
    """The dataset card, and the manifest last (the run is finished only then); `kept`: the
    parsed chunks the token cache served or took; `run_id`: the identity the parts carry;
    `extra`: more top-level keys of the manifest (a mixture's)."""
    # polars (via etl.pipeline.resources): off `etl run`'s start-up imports
    from etl.pipeline.resources import manifest_for

    assert counts.add_up(), counts
    res.encoder.close()  # the token cache's new segments, before the manifest that counts them
    manifest = {**manifest_for(res, inputs, counts, run_id=run_id), **extra}
    if kept is not None and "token_cache" in manifest:
        manifest["token_cache"]["parsed_chunks"] = kept.summary()
    write_card(output, manifest, weights=res.weights)  # for `datasets.load_dataset(DST)`: lists the parts
    output.commit(manifest)
    return manifest


def prepare(srcs: list[str], dst: str, config: RunConfig, *, cache: CacheSettings | None = None,
            ) -> tuple[Path, list[list[Source]], list[Path]]:
    """What every run checks before any work: DST's folder, the input files of each SRC, the
    token cache apart from SRC and DST, the entries of DST that hold inputs, DST writable by etl.

    Raises:
        EtlError: in milliseconds, before the tokenizer loads or Ray starts.
    """
    out = _target(dst)
    found = [_inputs(src, out, storage=config.storage_format is not None) for src in srcs]
    check_apart(cache, srcs, out, tokenizer=config.tokenizer)  # before the cache or DST is made
    holds_inputs = [path for _, holds in found for path in holds]
    check_target(out, keep=holds_inputs)
    return out, [sources for sources, _ in found], holds_inputs


def _target(dst: str) -> Path:
    """DST's folder: a path, or a file:// URI's path (an object store is refused, saying why)."""
    if is_uri(dst):
        dst = local_path(dst, what="DST")
    out = Path(dst)
    if out.exists() and not out.is_dir():
        raise EtlError(f"DST {dst} is a file; pass a folder (it is created if missing)")
    return out


def _inputs(src: str, out: Path, *, storage: bool) -> tuple[list[Source], list[Path]]:
    """The input files, and the entries of DST that hold them when SRC lies inside DST.

    DST is never read as input: when it lies inside SRC its files are skipped. SRC may be a URI:
    `file://` is its path; another filesystem's (s3://, gs://...) is listed through pyarrow and
    cannot hold DST, a local folder. `storage`: the export stage writes domain folders into DST,
    so no input may lie inside it.
    """
    if is_uri(src):
        if (path := local_or_none(src)) is None:
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
