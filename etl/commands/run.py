"""`etl run SRC DST`: raw conversations -> tokenized Parquet with masks, turns, rejects, manifest."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any

NAME = "run"
HELP = "tokenize, mask and truncate raw conversations into Parquet"
DESCRIPTION = """Read SRC (a .jsonl/.json/.parquet file, optionally .gz/.zst, a directory or a glob,
or a URI: file://, s3://, gs://, ...), and write DST/data, DST/turns, DST/_rejects and
DST/_manifest.json (DST: a path or a file:// URI).

exit status: 0 done; 2 an error (nothing finished); 3 done, but some input could not be
read to its end (a warning names it and what was kept); 4 input was read and nothing
written (every record rejected or dropped; this outranks 3).

With `sources` in the config file (a mixture of several inputs, each with its own options,
mixed by weight), SRC is left out: etl run --config mix.toml DST (README "Mixtures").

examples:
  etl run examples/raw parquet/
  etl run chats.jsonl out/ --tokenizer path/to/qwen2.5 --template chatml --seq-len 4096
  etl run s3://bucket/raw/ out/          # credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
  etl run --config examples/configs/mixture.toml mix/
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    # The settings' flags (type, choices, help, default) come from their declarations.
    from etl.columns import RAY_CONNECT_TIMEOUT_S
    from etl.config.flags import add_flags

    p.add_argument("src", metavar="SRC", nargs="?", help="input file, directory or glob, or a URI pyarrow reads "
                   "(file://, s3://, gs://; options such as ?endpoint_override=HOST:PORT in the URI); left out "
                   "when the config lists sources")
    p.add_argument("dst", metavar="DST", nargs="?", help="output directory: new, empty, or an earlier etl output "
                   "(only the files its manifest lists are replaced)")
    p.add_argument("--config", help="JSON or TOML config file (seed-004 schema; keys: `etl config`); "
                   "flags override it")
    add_flags(p, ("tokenizer", "template", "seq_len", "input_type", "truncation"))
    p.add_argument("--no-default-system", action="store_true",
                   help="do not insert a system message when missing (default_system: null in a config)")
    p.add_argument("--engine", choices=["local", "ray"], default="local",
                   help="execution engine: local (default) or ray (a Ray cluster, `pip install etl[ray]`; "
                   "same rows, README 'Running on Ray')")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="with --engine ray: the cluster to join (default $RAY_ADDRESS, else a local one)")
    p.add_argument("--ray-timeout", type=float, metavar="SECONDS",
                   help="with --engine ray: seconds to wait for the cluster at the address to answer before "
                   f"giving up with an error (default {RAY_CONNECT_TIMEOUT_S:g})")
    add_flags(p, ("chunk_bytes", "max_record_bytes"))
    add_cache_flags(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument("--timings", action="store_true",
                   help="print wall seconds per stage (parse runs on a background thread, overlapping tokenize; "
                   "startup: from the process's start to the first chunk's parse)")


def add_cache_flags(p: argparse.ArgumentParser) -> None:
    """The token cache's flags (README "Token cache")."""
    p.add_argument("--cache", metavar="DIR", help="token cache folder: content ids and parsed input chunks kept "
                   "across runs, so a rerun with other options neither tokenizes nor parses again (default "
                   "$ETL_CACHE_DIR, else ~/.cache/etl/tokens)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor fill the token cache")
    p.add_argument("--cache-max-gb", type=float, metavar="GB", help="the cache's size cap; the least recently "
                   "used segments and parsed chunks go first (default $ETL_CACHE_MAX_GB, else 4)")


def run(args: argparse.Namespace) -> int:
    from etl.pipeline.startup import tune_malloc

    tune_malloc()  # before the libraries allocate (and their threads take arenas)
    from etl.cache.folder import CacheSettings
    from etl.config.from_file import config_from_args
    from etl.errors import EtlError
    from etl.pipeline.run import run as run_pipeline

    config = config_from_args(args)
    src, dst = _locations(args.src, args.dst, mixture=config.mixture is not None)
    if args.no_cache and args.cache:
        raise EtlError("--cache and --no-cache contradict each other; pass one")
    cache = CacheSettings.resolve(args.cache, disabled=args.no_cache, max_gb=args.cache_max_gb)
    timings: Counter[str] = Counter()
    if config.mixture is not None:
        from etl.pipeline.mixture import run_mixture

        if args.engine == "ray":
            raise EtlError("a mixture (sources in the config) runs on the local engine only; drop --engine ray, "
                           "or run each source on Ray into its own DST")
        manifest = run_mixture(dst, config, progress=not args.quiet, timings=timings, cache=cache)
    elif args.engine == "ray":
        from etl.engine.ray_run import require_ray
        from etl.engine.ray_run import run as run_ray

        require_ray()
        manifest = run_ray(src, dst, config, address=args.ray_address, progress=not args.quiet,
                           timings=timings, cache=cache, connect_timeout=args.ray_timeout)
    else:
        if args.ray_address or args.ray_timeout is not None:
            raise EtlError("--ray-address and --ray-timeout need --engine ray")
        manifest = run_pipeline(src, dst, config, progress=not args.quiet, timings=timings, cache=cache)
    if not args.quiet:
        for note in mixture_notes(manifest):
            print(f"etl run: {note}", file=sys.stderr)
        print(summary(manifest, dst), file=sys.stderr)
        if hint := format_hint(manifest, dst):
            print(hint, file=sys.stderr)
    if args.timings:
        # tokenize_plan includes the tokenizer's own time, shown on its own line too; tokenizer
        # includes tokenizer_ids (copying ids out of the tokenizer's Python lists into numpy).
        from etl.cache.encoder import SAVED

        saved = timings.pop(SAVED, None)
        stages = ", ".join(f"{name} {sec:.2f}s" for name, sec in sorted(timings.items(), key=lambda kv: -kv[1]))
        print(f"etl run timings: {stages}", file=sys.stderr)
        if line := cache_line(manifest.get("token_cache"), saved):
            print(line, file=sys.stderr)
    return exit_status(manifest, dst, quiet=args.quiet)


def cache_line(cache: dict[str, Any] | None, saved: float | None) -> str | None:
    """--timings' line on the token cache: texts read back, and the tokenizer seconds that saved."""
    if not cache:
        return None
    where = f"token cache {cache['dir']}" if cache["dir"] else "no token cache (--no-cache)"
    line = (f"etl run: {where}: {cache['strings']:,} texts, {cache['distinct']:,} distinct per batch, "
            f"{cache['from_cache']:,} read from the cache ({cache['hit_rate']:.1%}), {cache['tokenized']:,} tokenized")
    if saved:
        line += f"; saved ~{saved:.1f}s of tokenizing ({cache['tokens_from_cache']:,} tokens at this tokenizer's rate)"
    if parsed := cache.get("parsed_chunks"):
        line += f"; {parsed['from_cache']:,} of {parsed['from_cache'] + parsed['parsed']:,} input chunks read back parsed"
    return line


def _locations(src: str | None, dst: str | None, *, mixture: bool) -> tuple[str, str]:
    """(SRC, DST) from the positionals: a mixture takes its inputs from the config, DST alone."""
    from etl.errors import EtlError

    if mixture:
        if dst is not None:
            raise EtlError("the config lists sources, so SRC is left out: etl run --config FILE DST")
        if src is None:
            raise EtlError("etl run needs DST: etl run --config FILE DST")
        return "", src
    if src is None or dst is None:
        raise EtlError("etl run needs SRC and DST (or a config that lists sources, and DST); see etl run --help")
    return src, dst


def mixture_notes(manifest: dict[str, Any]) -> list[str]:
    """One line per source of a mixture whose share needed repeating or was not met."""
    return [s["note"] for s in (manifest.get("mixture") or {}).get("sources", []) if s.get("note")]


EXIT_INCOMPLETE = 3  # etl.cli: done, but some input could not be read to its end
EXIT_EMPTY = 4  # etl.cli: input was read and nothing written


def exit_status(manifest: dict[str, Any], dst: str, *, quiet: bool) -> int:
    """0; 3 when some input was not read to its end; 4 when records were read and none written.

    4 outranks 3: an output with nothing to train on is unusable whatever the cause (a damaged
    file's records rejected as `corrupt_file` included); the damaged inputs are still named.
    Nothing read (an empty file or folder) is an empty dataset, not a failure: 0.
    """
    counts = manifest["counts"]
    empty = bool(counts["read"]) and not counts["written"]
    status = _incomplete(manifest, empty=empty)
    if not empty:
        return status
    if quiet and (hint := format_hint(manifest, dst)):  # the one line that says how to fix it
        print(hint, file=sys.stderr)
    queries = "".join(f" --query {q}" for q, key in (("rejects", "rejected"), ("drops", "dropped")) if counts[key])
    outranks = f", which outranks {EXIT_INCOMPLETE}" if status else ""
    read = "the 1 record read was" if counts["read"] == 1 else f"all {counts['read']:,} records read were"
    print(f"etl run: error: nothing written: {read} rejected or dropped; `etl stats {dst}{queries}` says why "
          f"(exit status {EXIT_EMPTY}{outranks})", file=sys.stderr)
    return EXIT_EMPTY


def _incomplete(manifest: dict[str, Any], *, empty: bool) -> int:
    """Warn, even with --quiet, about every input not read to its end; the exit status says so
    (unless nothing was written: then `exit_status` names its own)."""
    lost = manifest.get("incomplete_inputs") or []
    for item in lost:
        print(f"etl run: warning: {item['path']}: {_lost(item)} ({item['error']})", file=sys.stderr)
    if lost:
        status = "" if empty else f" (exit status {EXIT_INCOMPLETE})"
        print(f"etl run: warning: {len(lost)} input(s) incomplete; the output holds everything else{status}",
              file=sys.stderr)
    return EXIT_INCOMPLETE if lost else 0


def _lost(item: dict[str, Any]) -> str:
    """What became of an input not read to its end (README "Every input is counted")."""
    n = item["records_read"]
    if item["reason"] == "unreadable_dir":
        return "folder could not be listed"
    if item["reason"] == "corrupt_file":  # read only after its check passed: changed since?
        return (f"failed its integrity check after {n:,} records were used (did it change during the run?)" if n
                else "failed its integrity check; none of its records were used")
    return f"{n:,} records salvaged, the rest lost" if n else "nothing could be read"


def _reasons(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    detail = ", ".join(f"{reason} {n:,}" for reason, n in counts.items())
    return f"{total:,} ({detail})" if detail else "0"


def summary(manifest: dict[str, object], dst: str) -> str:
    """One line: the counts that must add up, and the tokens written."""
    n = manifest["counts"]
    assert isinstance(n, dict)
    copies = f" + {n['repeated']:,} repeated copies" if n.get("repeated") else ""
    return (
        f"etl run: read {n['read']:,}, written {n['written']:,}{copies} ({n['truncated']:,} truncated), "
        f"dropped {_reasons(n['dropped'])}, rejected {_reasons(n['rejected'])}; "
        f"{n['tokens']:,} tokens ({n['trained_tokens']:,} trained) -> {dst}"
    )


# Keys that identify a known record layout, and the input type that reads it.
KEY_HINTS = (
    ("conversations", "sharegpt"),
    ("messages", "chat"),
    ("instruction", "instruction"),
    ("completion", "prompt_completion"),
    ("chosen", "transcript"),
    ("text", "text"),
)


def format_hint(manifest: dict[str, object], dst: str) -> str | None:
    """When most records lack the key the input type needs, name the type their keys suggest.

    The keys come from the first `missing_key` reject's detail, which the builder wrote from
    the whole parsed record (`etl.formats.base.with_record_keys`): its `raw` column keeps only
    the first 500 characters, too few to parse a long record.
    """
    import pyarrow.parquet as pq

    from etl.formats.base import record_keys

    counts = manifest["counts"]
    assert isinstance(counts, dict)
    missing = counts["rejected"].get("missing_key", 0)
    if not counts["read"] or missing * 2 < counts["read"]:
        return None
    rejects = pq.read_table(f"{dst}/_rejects", filters=[("reason", "=", "missing_key")], columns=["detail"])
    keys = set(record_keys(rejects.column("detail")[0].as_py() if rejects.num_rows else None))
    current = manifest["config"]["input_type"]  # type: ignore[index]
    for key, kind in KEY_HINTS:
        if key in keys and kind != current:
            return (f"etl run: hint: {missing:,} records lack the keys input type {current!r} reads; "
                    f"they have {sorted(keys)}: try --input-type {kind} (options in --config)")
    return None
