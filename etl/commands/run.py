"""`etl run SRC DST`: raw conversations -> tokenized Parquet with masks, turns, rejects, manifest."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any

from etl.columns import RAY_CONNECT_TIMEOUT_S
from etl.errors import EtlError

NAME = "run"
HELP = "tokenize, mask and truncate raw conversations into Parquet"
DESCRIPTION = """Read SRC (a .jsonl/.json/.parquet file, optionally .gz/.zst, a directory or a glob,
or a URI: file://, s3://, gs://, ...), and write DST/data, DST/turns, DST/_rejects and
DST/_manifest.json (DST: a path or a file:// URI).

exit status: 0 done; 2 an error (nothing finished); 3 done, but some input could not be
read to its end (a warning names it and what was kept); 4 input was read and nothing
written (every record rejected or dropped; this outranks 3).

With `sources` in the config file (a mixture of several inputs, each with its own options,
mixed by weight), SRC is left out: etl run --config mix.toml DST (docs/mixtures.md).

With output.storage_format (bin or h5) in the config, the run then writes its token files into
DST too, as `etl export DST DST --format bin|h5` does: DST/<domain>/ (train), DST/_val/<domain>/.

Defaults follow the tokenizer: --template auto is hf (the tokenizer's own chat_template, so the
ids equal transformers' apply_chat_template) for a tokenizer with a chat_template, and ngpt for
`bytes`, a tokenizer that carries ngpt's markers or one without a chat_template; a conversation
without a system message gets the template's own (hf: the one its chat_template writes, e.g.
Qwen2.5's, or none for Qwen3; presets: "you are a helpful assistant.") unless default_system is
set in the config or --no-default-system is given. The manifest records the choices made.

examples:
  etl run examples/raw parquet/
  etl run chats.jsonl out/ --tokenizer path/to/qwen2.5 --seq-len 4096   # template hf: Qwen's own
  etl run chats.jsonl out/ --tokenizer path/to/qwen2.5 --template chatml --no-default-system
  etl run s3://bucket/raw/ out/          # credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
  etl run --config examples/configs/mixture.toml mix/
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    # The settings' flags (type, choices, help, default) come from their declarations.
    from etl.config.build import add_flags

    p.add_argument("src", metavar="SRC", nargs="?", help="input file, directory or glob, or a URI pyarrow reads "
                   "(file://, s3://, gs://; options such as ?endpoint_override=HOST:PORT in the URI); left out "
                   "when the config lists sources")
    p.add_argument("dst", metavar="DST", nargs="?", help="output directory: new, empty, or an earlier etl output "
                   "(only the files its manifest lists are replaced)")
    p.add_argument("--config", help="JSON or TOML config file (keys: `etl config`); "
                   "flags override it")
    add_flags(p)  # every flag a setting declares (etl.config.file, RunConfig): none left off by hand
    p.add_argument("--no-default-system", action="store_true",
                   help="do not insert a system message when missing (default_system: null in a config; "
                   "default: the template's own)")
    p.add_argument("--engine", choices=["local", "ray"], default="local",
                   help="execution engine: local (default) or ray (a Ray cluster, `pip install etl[ray]`; "
                   "same rows, docs/ray.md)")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="with --engine ray: the cluster to join (default $RAY_ADDRESS, else a local one)")
    p.add_argument("--ray-timeout", type=float, metavar="SECONDS",
                   help="with --engine ray: seconds to wait for the cluster at the address to answer before "
                   f"giving up with an error (default {RAY_CONNECT_TIMEOUT_S:g})")
    _add_cache_flags(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument("--timings", action="store_true",
                   help="print wall seconds per stage (parse runs on a background thread, overlapping tokenize; "
                   "startup: from the process's start to the first chunk's parse)")


def _add_cache_flags(p: argparse.ArgumentParser) -> None:
    """The token cache's flags (docs/token-cache.md)."""
    p.add_argument("--cache", metavar="DIR", help="keep a token cache in DIR: content ids and parsed input chunks "
                   "kept across runs, so a rerun with other options neither tokenizes nor parses again (default "
                   "$ETL_CACHE_DIR; with neither, no cache: filling one costs a first run ~7%%, and a rerun at "
                   "another --seq-len runs ~1.7x faster, docs/token-cache.md)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor fill the token cache, even with "
                   "$ETL_CACHE_DIR set")
    p.add_argument("--cache-max-gb", type=float, metavar="GB", help="the cache's size cap; the least recently "
                   "used segments and parsed chunks go first (default $ETL_CACHE_MAX_GB, else 4)")


def run(args: argparse.Namespace) -> int:
    # etl.pipeline pulls duckdb/pyarrow: only when run, not for --help
    from etl.pipeline.startup import tune_malloc

    tune_malloc()  # before the libraries allocate (and their threads take arenas)
    # polars/duckdb/pydantic: after tune_malloc, and not for --help
    from etl.analysis.run_summary import run_outcome, summary_lines
    from etl.cache.folder import CacheSettings
    from etl.config.build import settings_from_args
    from etl.pipeline.driver import drive

    engine = _engine(args)
    if args.no_cache and args.cache:
        raise EtlError("--cache and --no-cache contradict each other; pass one")
    cache = CacheSettings.resolve(args.cache, disabled=args.no_cache, max_gb=args.cache_max_gb)
    settings = settings_from_args(args)
    config, timings = settings.config, Counter[str]()
    if config.storage_format == "h5":  # a missing h5py fails before DST is touched, not after the run
        from etl.export.backends import require_h5py

        require_h5py()
    if settings.mixture is None:
        manifest = drive(settings, engine, progress=not args.quiet, timings=timings, cache=cache)
    else:
        # polars: only for a mixture
        from etl.mixture.run import run_mixture

        if args.engine == "ray":
            raise EtlError("a mixture (sources in the config) runs on the local engine only; drop --engine ray, "
                           "or run each source on Ray into its own DST")
        manifest = run_mixture(settings, progress=not args.quiet, timings=timings, cache=cache)
    if not args.quiet:
        _print(summary_lines(manifest, settings.dst))
    if config.storage_format is not None:  # the run's token files (etl export's), into DST
        # h5py / the export writer: only when the config asks for token files
        from etl.export.run_stage import export_stage

        _print(export_stage(settings.dst, storage_format=config.storage_format,
                            max_tokens_per_shard=config.max_tokens_per_shard, quiet=args.quiet))
    status, lines = run_outcome(manifest, settings.dst, quiet=args.quiet,
                                timings=timings if args.timings else None)
    _print(lines)
    return status


def _engine(args: argparse.Namespace) -> Any:
    """The engine `--engine` names: this process, or a Ray cluster (`--ray-address`, `--ray-timeout`)."""
    if args.engine == "ray":
        # ray (a slow import: docs/design.md, Measured costs): only with --engine ray
        from etl.engine.ray_run import RayEngine, require_ray

        require_ray()
        return RayEngine(args.ray_address, connect_timeout=args.ray_timeout)
    if args.ray_address or args.ray_timeout is not None:
        raise EtlError("--ray-address and --ray-timeout need --engine ray")
    from etl.pipeline.run import LocalEngine

    return LocalEngine()


def _print(lines: list[str]) -> None:
    for line in lines:
        print(line, file=sys.stderr)
