"""`etl run --engine ray`: the local engine's per-chunk work as Ray Data `map_batches` stages.

read (one task per file, etl's reader) -> parse (tasks) -> [dedup: groupby + join, see
`etl.engine.dedup`] -> plan + assemble + write (actors that load the tokenizer once). Workers
write parts into DST's journaled staging folder; `RayEngine` renames them into place from the
workers' results (`etl.engine.commit`), and the run driver (`etl.pipeline.driver`) writes the
manifest last from their counts, so a killed run never looks finished and the next run removes
what it left.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from etl.cache.folder import CacheSettings
from etl.config.run_config import RunConfig, RunSettings, RunSource
from etl.engine.ray_connect import connect, held_stderr
from etl.errors import EtlError
from etl.ingest.discover import Source
from etl.output.part_writer import PartWriter, StagedParts
from etl.pipeline.accounting import Counts, Timings
from etl.pipeline.driver import drive
from etl.tokens.backend import settle

if TYPE_CHECKING:
    from etl.cache.parsed import ParsedChunks
    from etl.pipeline.plan import RunPlan
    from etl.pipeline.resources import Resources
    from etl.tokens.tokenizer import TextTokenizer

# One actor per CPU of the cluster, each tokenizing with one Rust thread: the Python part of a
# chunk (plan, assemble, write) then runs in parallel too, where one actor with two threads ran it
# alone (less chunk work in all: docs/design.md, Measured costs). Each actor
# reserves ACTOR_CPUS, the parse tasks' share, so Ray Data fuses the parse into the actor (no
# object-store round trip of parsed chunks) and leaves room for the read tasks.
THREADS_PER_ACTOR = 1
CPUS_PER_ACTOR = 1
ACTOR_CPUS = PARSE_CPUS = 0.5
# Re-cut tasks at once (`_one_chunk_per_block`): they reserve no CPU, so without a cap Ray started
# a worker process for each block in flight.
RECUT_TASKS = 1


# Input bytes per hash partition of the dedup shuffles: ~24 B of (key, chunk) per ~500 B record,
# so 5 GiB of input is ~250 MiB of keys per partition.
INPUT_PER_PARTITION = 5 << 30


def _cpus() -> int:
    # ray (slow to import: docs/design.md, Measured costs): only once the Ray engine runs;
    # require_ray checks it first
    import ray

    return int(ray.cluster_resources().get("CPU", 1))


def _pipeline(sources: list[Source], res: Resources, staging: Path, *, cpus: int, cache: CacheSettings | None,
              identity: dict[str, str]) -> Any:
    """The Ray dataset of per-chunk results (`etl.engine.worker.RESULT_SCHEMA` rows)."""
    # ray (slow to import: docs/design.md, Measured costs): only once the Ray engine runs;
    # require_ray checks it first
    import ray

    # polars/duckdb: only once the Ray engine runs
    from etl.engine.dedup import earlier_keys
    from etl.engine.ray_read import ChunkSource
    from etl.engine.worker import ChunkProcessor, parse_batch

    cfg = res.config
    actors = max(1, cpus // CPUS_PER_ACTOR)
    size = sum(s.size() for s in sources)
    partitions = max(2, cpus, size // INPUT_PER_PARTITION)
    raw = ray.data.read_datasource(
        ChunkSource(sources, chunk_bytes=cfg.chunk_bytes, max_items=cfg.max_items), num_cpus=0.5
    )
    parsed = _one_chunk_per_block(raw).map_batches(
        parse_batch, fn_kwargs={"query": res.builder_query()}, batch_size=1, batch_format="pyarrow",
        num_cpus=PARSE_CPUS,
    )
    if cfg.deduplicate:
        parsed = parsed.materialize()  # read once for both the keys and the work (object store)
        earlier = earlier_keys(parsed, sources, exact=cfg.dedup_mode == "exact",
                               split_seed=cfg.split_seed, partitions=partitions)
        # Materialized before the actors start: its shuffle tasks ask for a whole CPU each, which a
        # 1-CPU cluster never frees beside an actor's 0.5 (a hang). A join emits nothing before
        # its last input anyway, so the actors lose no overlap.
        parsed = parsed.join(earlier, "left_outer", num_partitions=partitions, on=("file", "chunk")).materialize()
        parsed = _one_chunk_per_block(parsed)
    return parsed.map_batches(
        ChunkProcessor, fn_constructor_kwargs={"plan": _plan_for_workers(res.plan, size), "sources": sources, "staging": str(staging),
                                               "identity": identity, "threads": THREADS_PER_ACTOR, "cache": cache},
        batch_size=1, batch_format="pyarrow", compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=ACTOR_CPUS,
    )


def _one_chunk_per_block(dataset: Any) -> Any:
    """`dataset` re-cut to one chunk row per block: Ray's block sizing would otherwise merge chunk
    rows and serialize them, and hand several chunks to one actor.

    Its tasks only slice blocks, so they reserve no CPU. With Ray's default of one, a cluster of
    1 CPU never started them (a hang: the actor's 0.5 and a file's read task's 0.5 held it all;
    `ray start --num-cpus 1`), and on 2 CPUs each waited for a whole CPU beside the actors. Ray
    Data's `repartition` takes no resource arguments, so they are set on its operator, where
    Ray 2.5x keeps them (`ray_remote_args`), with its concurrency (`compute`, RECUT_TASKS: a task
    reserving no CPU has no limit of its own); another Ray keeps its defaults.
    """
    import ray.data

    out = dataset.repartition(target_num_rows_per_block=1)
    op = getattr(getattr(out, "_logical_plan", None), "dag", None)
    remote_args = getattr(op, "ray_remote_args", None)
    if isinstance(remote_args, dict):
        remote_args["num_cpus"] = 0
    if op is not None and hasattr(op, "compute"):  # a frozen dataclass in Ray 2.5x
        object.__setattr__(op, "compute", ray.data.TaskPoolStrategy(size=RECUT_TASKS))
    return out


def for_workers(config: RunConfig, input_bytes: int | None = None) -> RunConfig:
    """The config as workers need it: a tokenizer path made absolute, since a worker's working
    directory is its node's (a `ray start` cluster's, not the driver's), and the tokenizer backend
    settled for the run's `input_bytes` as a local run settles it. Pass `Resources.config`: its
    template and default system prompt are resolved (`auto` decided once, on the driver)."""
    if input_bytes is not None and (settled := settle(config.tokenizer_backend, input_bytes)) != config.tokenizer_backend:
        config = config.replace(tokenizer_backend=settled)
    if config.tokenizer == "bytes" or not Path(config.tokenizer).exists():
        return config
    return config.replace(tokenizer=str(Path(config.tokenizer).absolute()))


def _plan_for_workers(plan: RunPlan, input_bytes: int) -> RunPlan:
    """The plan as workers need it: every config's tokenizer as `for_workers` gives the run's."""
    shipped = for_workers(plan.config, input_bytes)
    return plan.with_changes(tokenizer=shipped.tokenizer, tokenizer_backend=shipped.tokenizer_backend)


def worker_error(exc: Exception) -> EtlError:
    """One line for a worker's failure: the etl error it raised if any, with what to check."""
    text = str(exc)
    lines = [line for line in text.splitlines() if line.startswith("etl.errors.EtlError: ")]
    why = lines[-1].removeprefix("etl.errors.EtlError: ") if lines else (text.splitlines() or [type(exc).__name__])[-1]
    return EtlError(f"--engine ray: a worker failed: {why}; every node must see SRC, DST and the tokenizer "
                    "at the same absolute paths, with the same etl installed")


class RayEngine:
    """Maps chunks to parts on a Ray cluster: workers stage each chunk's parts in DST's journaled
    staging folder, and the driver renames them into place in (file, chunk) order
    (`etl.engine.commit`), so DST ends as the local engine leaves it."""

    def __init__(self, address: str | None = None, *, connect_timeout: float | None = None) -> None:
        self.address, self.connect_timeout = address, connect_timeout
        self.kept: ParsedChunks | None = None  # the workers keep no parsed chunks, only token ids
        self.cache: CacheSettings | None = None
        self.timings = Timings()

    def paths(self, out: Path, files: list[list[Source]]) -> tuple[Path, list[list[Source]]]:
        """Absolute paths: workers run elsewhere (a URI SRC's files: workers open them)."""
        return out.absolute(), [[dataclasses.replace(s, path=s.path.absolute()) for s in fs] for fs in files]

    @contextlib.contextmanager
    def start(self, plan: RunPlan, files: list[list[Source]], timings: Timings, *, tokenizer: TextTokenizer | None,
              cache: CacheSettings | None, progress: bool) -> Iterator[Resources]:
        """Join (or start) the cluster while the tokenizer loads; a cluster started here stops on leaving."""
        # ray (slow to import: docs/design.md, Measured costs): only once the Ray engine runs;
        # require_ray checks it first
        import ray
        from ray.data import DataContext

        # polars/duckdb: only once the Ray engine runs
        from etl.pipeline.resources import build_resources

        self.cache, self.timings = cache, timings
        # The tokenizer loads while Ray starts (docs/design.md, Measured costs).
        with ThreadPoolExecutor(max_workers=1) as pool:
            loading = pool.submit(build_resources, plan, tokenizer=tokenizer, cache=cache)
            owns_ray = connect(self.address, timeout=self.connect_timeout, quiet=not progress)
        # --quiet: Ray's own lines in the run (the driver's C++ core logs, Ray Data's UserWarnings)
        # are held and dropped; `connect` holds its own
        with held_stderr(replay=False) if not progress else contextlib.nullcontext():
            try:
                res = loading.result()
                DataContext.get_current().enable_progress_bars = progress
                if not progress:  # --quiet: Ray Data's plan and timing lines too
                    logging.getLogger("ray.data").setLevel(logging.ERROR)
                yield res
            finally:
                if owns_ray:
                    ray.shutdown()

    def map_chunks(self, sources: tuple[RunSource, ...], files: list[list[Source]], res: Resources, parts: PartWriter, *,
                   progress: bool) -> list[Counts]:
        """The workers' parts renamed into `parts`, their counts, cache counts and stage seconds merged."""
        # ray (slow to import: docs/design.md, Measured costs): only once the Ray engine runs;
        # require_ray checks it first
        import ray

        # polars/duckdb: only once the Ray engine runs
        from etl.engine.commit import (
            commit_parts,
            merge_backends,
            merge_cache_stats,
            merge_counts,
            merge_timings,
        )

        # `etl run` runs a mixture on the local engine: its staged first pass is the driver's
        assert len(files) == 1 and not isinstance(parts, StagedParts) and parts.output is not None
        staging = parts.output.staging()
        try:
            results = _pipeline(files[0], res, staging, cpus=_cpus(), cache=self.cache,
                                identity=parts.identity).take_all()
        except ray.exceptions.RayError as exc:  # a worker's error, as one line (the journal cleans up)
            raise worker_error(exc) from exc
        commit_parts(parts, staging, results)
        res.encoder.stats.add(merge_cache_stats(results))  # the workers' cache counts, logged by close
        if hasattr(res.tokenizer, "backend_used"):  # the manifest's token_cache.backend: the workers' one
            res.tokenizer.backend_used = merge_backends(results)
        self.timings.update(merge_timings(results))  # worker seconds per stage
        return [merge_counts(results)]


def run(
    src: str, dst: str, config: RunConfig, *, address: str | None = None, progress: bool = True,
    timings: Counter[str] | None = None, cache: CacheSettings | None = None, connect_timeout: float | None = None,
) -> dict[str, Any]:
    """Run the pipeline from SRC to DST on Ray; returns the manifest, as `etl.pipeline.run.run`.

    Joins the cluster at `address` (else RAY_ADDRESS) within `connect_timeout` seconds (None: 30; an
    error naming it after that), or starts a local one for the run. DST must
    be a path (or file:// URI) that every node sees at the same place (shared storage). `cache`:
    the token cache each worker reads and fills at that path on its own node (None: none).
    """
    engine = RayEngine(address, connect_timeout=connect_timeout)
    return drive(RunSettings.one(src, dst, config), engine, progress=progress, timings=timings, cache=cache)


__all__ = ["RayEngine", "require_ray", "run"]


def require_ray() -> None:
    """Fail in one line when Ray is not installed."""
    try:
        # ray (slow to import: docs/design.md, Measured costs): only once the Ray engine runs;
        # require_ray checks it first
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise EtlError("--engine ray needs Ray Data: pip install 'etl[ray]' (or 'ray[data]')") from exc
