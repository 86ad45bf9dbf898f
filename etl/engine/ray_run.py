"""`etl run --engine ray`: the local engine's per-chunk work as Ray Data `map_batches` stages.

read (one task per file, etl's reader) -> parse (tasks) -> [dedup: groupby + join, see
`etl.engine.dedup`] -> plan + assemble + write (actors that load the tokenizer once). Workers
write parts into DST's journaled staging folder; the driver renames them into place and writes
the manifest last from the workers' counts (`etl.engine.commit`), so a killed run never looks
finished and the next run removes what it left.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from etl.cache.folder import CacheSettings
from etl.config.run_config import RunConfig
from etl.engine.ray_connect import connect
from etl.errors import EtlError

# One actor per CPU of the cluster, each tokenizing with one Rust thread: the Python part of a
# chunk (plan, assemble, write: ~15% of its time) then runs in parallel too, where one actor with
# two threads ran it alone (T0 on 2 CPUs: 13.3 s of chunk work against 15.2 s). Each actor
# reserves ACTOR_CPUS, the parse tasks' share, so Ray Data fuses the parse into the actor (no
# object-store round trip of parsed chunks) and leaves room for the read tasks.
THREADS_PER_ACTOR = 1
CPUS_PER_ACTOR = 1
ACTOR_CPUS = PARSE_CPUS = 0.5


# Input bytes per hash partition of the dedup shuffles: ~24 B of (key, chunk) per ~500 B record,
# so 5 GiB of input is ~250 MiB of keys per partition.
INPUT_PER_PARTITION = 5 << 30


def _cpus() -> int:
    import ray

    return int(ray.cluster_resources().get("CPU", 1))


def _pipeline(sources: list[Any], res: Any, staging: Path, *, cpus: int, cache: CacheSettings | None,
              identity: dict[str, str]) -> Any:
    """The Ray dataset of per-chunk results (`etl.engine.worker.RESULT_SCHEMA` rows)."""
    import ray

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
    # One chunk per block: Ray's block sizing would otherwise merge chunk rows and serialize them.
    parsed = raw.repartition(target_num_rows_per_block=1).map_batches(
        parse_batch, fn_kwargs={"query": res.builder_query()}, batch_size=1, batch_format="pyarrow",
        num_cpus=PARSE_CPUS,
    )
    if cfg.deduplicate:
        parsed = parsed.materialize()  # read once for both the keys and the work (object store)
        earlier = earlier_keys(parsed, sources, exact=cfg.dedup_mode == "exact",
                               split_seed=cfg.split_seed, partitions=partitions)
        parsed = parsed.join(earlier, "left_outer", num_partitions=partitions, on=("file", "chunk"))
        parsed = parsed.repartition(target_num_rows_per_block=1)
    return parsed.map_batches(
        ChunkProcessor, fn_constructor_kwargs={"config": for_workers(cfg), "sources": sources, "staging": str(staging),
                                               "identity": identity, "threads": THREADS_PER_ACTOR, "cache": cache},
        batch_size=1, batch_format="pyarrow", compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=ACTOR_CPUS,
    )


def for_workers(config: RunConfig) -> RunConfig:
    """The config as workers need it: a tokenizer path made absolute, since a worker's working
    directory is its node's (a `ray start` cluster's, not the driver's)."""
    if config.tokenizer == "bytes" or not Path(config.tokenizer).exists():
        return config
    return dataclasses.replace(config, tokenizer=str(Path(config.tokenizer).absolute()))


def worker_error(exc: Exception) -> EtlError:
    """One line for a worker's failure: the etl error it raised if any, with what to check."""
    text = str(exc)
    lines = [line for line in text.splitlines() if line.startswith("etl.errors.EtlError: ")]
    why = lines[-1].removeprefix("etl.errors.EtlError: ") if lines else (text.splitlines() or [type(exc).__name__])[-1]
    return EtlError(f"--engine ray: a worker failed: {why}; every node must see SRC, DST and the tokenizer "
                    "at the same absolute paths, with the same etl installed")


def _finish(res: Any, sources: list[Any], results: list[dict[str, Any]], output: Any, staging: Path, *,
            run_id: str) -> dict[str, Any]:
    """Rename the workers' parts into place, then storage files, the card, the manifest last."""
    from etl.engine.commit import commit_parts, merge_cache_stats, merge_counts
    from etl.output.card import write_card
    from etl.output.parquet import identity_keys
    from etl.pipeline.resources import manifest_for

    config = res.config
    counts = merge_counts(results)
    assert counts.add_up(), counts
    commit_parts(output, staging, results, identity=identity_keys(run_id))
    res.encoder.stats.add(merge_cache_stats(results))  # the workers' cache counts, logged by close
    res.encoder.close()
    manifest = manifest_for(res, sources, counts, run_id=run_id)
    if config.storage_format != "parquet":
        from etl.output.storage import write_run_storage

        manifest["storage"] = write_run_storage(
            output.root, manifest, output, storage_format=config.storage_format,
            max_tokens_per_shard=config.max_tokens_per_shard,
        )
    write_card(output, manifest, weights=res.weights)
    output.commit(manifest)
    return manifest


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
    import ray
    from ray.data import DataContext

    from etl.engine.commit import merge_timings
    from etl.output.parquet import identity_keys
    from etl.output.writer import OutputWriter
    from etl.pipeline.resources import build_resources, run_identity
    from etl.pipeline.run import prepare

    started = time.perf_counter()
    out, sources, holds_inputs = prepare(src, dst, config, cache=cache)  # a URI SRC: workers open its files
    out = out.absolute()  # workers run elsewhere: they get absolute paths
    sources = [dataclasses.replace(s, path=s.path.absolute()) for s in sources]
    with ThreadPoolExecutor(max_workers=1) as pool:  # the tokenizer loads while Ray starts (~0.5 s)
        loading = pool.submit(build_resources, config, cache=cache)
        owns_ray = connect(address, timeout=connect_timeout, quiet=not progress)
    try:
        res = loading.result()
        DataContext.get_current().enable_progress_bars = progress
        if not progress:  # --quiet: Ray Data's plan and timing lines too
            logging.getLogger("ray.data").setLevel(logging.ERROR)
        with OutputWriter(out, kind="run", keep=holds_inputs) as output:
            staging = output.staging()
            run_id = run_identity(res, sources)  # the local engine's: same inputs and config, same bytes
            try:
                results = _pipeline(sources, res, staging, cpus=_cpus(), cache=cache,
                                    identity=identity_keys(run_id)).take_all()
            except ray.exceptions.RayError as exc:  # a worker's error, as one line (the journal cleans up)
                raise worker_error(exc) from exc
            manifest = _finish(res, sources, results, output, staging, run_id=run_id)
    finally:
        if owns_ray:
            ray.shutdown()
    if timings is not None:
        timings.update(merge_timings(results))
        timings["total"] = time.perf_counter() - started
    return {**manifest, "files": output.files()}


__all__ = ["require_ray", "run"]


def require_ray() -> None:
    """Fail in one line when Ray is not installed."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise EtlError("--engine ray needs Ray Data: pip install 'etl[ray]' (or 'ray[data]')") from exc
