"""`etl cache info|clear`: the token cache's size, hit rates and emptying (docs/token-cache.md)."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

NAME = "cache"
HELP = "show or empty the token cache (content ids kept across runs)"
DESCRIPTION = """\
The token cache keeps the ids of every content string a run tokenized, keyed by the tokenizer
and the string, so a rerun with another seq_len, mask, template or mixture reads them instead
of tokenizing; and each input chunk as parsed, keyed by its bytes and the parse settings, so
the rerun does not parse the JSON again either. `etl run` keeps one only when told where
(--cache DIR or $ETL_CACHE_DIR). This command's folder: --cache DIR, else $ETL_CACHE_DIR, else
~/.cache/etl/tokens (where earlier releases kept it by default).

  info    size, segments per tokenizer, parsed input chunks, and the hit rates of the last runs
  clear   remove every segment and parsed chunk (only etl's own files; the folder must be an etl
          token cache)

examples:
  etl cache info
  etl cache info --format json
  etl cache clear --cache /scratch/etl-tokens
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["info", "clear"], help="what to do")
    p.add_argument("--cache", metavar="DIR", help="the cache folder (default $ETL_CACHE_DIR, else ~/.cache/etl/tokens)")
    p.add_argument("--format", choices=["table", "json"], default="table", help="info's output format")
    p.add_argument("--runs", type=int, default=5, metavar="N", help="info: the last N runs to show (default 5)")


def run(args: argparse.Namespace) -> int:
    # dataclasses/hashlib: only when run, so every --help stays light
    from etl.cache import folder as fo

    root = Path(args.cache).expanduser() if args.cache else fo.default_root()
    if args.action == "clear":
        removed, freed = fo.clear(root)
        print(f"etl cache: removed {removed:,} files ({freed / 1e6:,.1f} MB) from {root}")
        return 0
    about = info(root, last=args.runs)
    print(json.dumps(about, indent=2) if args.format == "json" else render(about), file=sys.stdout)
    return 0


def info(root: Path, *, last: int) -> dict[str, Any]:
    """Size per namespace (tokenizer), the cap, and the logged runs' hit rates."""
    # dataclasses/hashlib: only when run, so every --help stays light
    from etl.cache import folder as fo

    spaces = []
    for folder in fo.namespaces(root):
        sizes = [p.stat().st_size for p in folder.iterdir() if fo.is_segment(p)]
        key = json.loads((folder / fo.KEY_FILE).read_text("utf-8"))
        spaces.append({"namespace": folder.name, "tokenizer_sha256": key.get("tokenizer_sha256"),
                       "tokenizers": key.get("tokenizers"), "segments": len(sizes), "bytes": sum(sizes)})
    parsed = [p.stat().st_size for p in fo.parsed_files(root)]
    runs = fo.runs(root)
    asked = sum(r.get("distinct", 0) for r in runs)
    return {"dir": str(root), "exists": fo.is_cache(root), "bytes": sum(s["bytes"] for s in spaces) + sum(parsed),
            "max_bytes": fo.max_bytes(), "namespaces": spaces,
            "parsed_chunks": {"files": len(parsed), "bytes": sum(parsed)}, "runs_logged": len(runs),
            "hit_rate": round(sum(r.get("from_cache", 0) for r in runs) / asked, 4) if asked else None,
            "last_runs": runs[-last:] if last > 0 else []}


def render(about: dict[str, Any]) -> str:
    if not about["exists"]:
        return f"token cache {about['dir']}: empty (no run has filled it yet)"
    size = f"{about['bytes'] / 1e6:,.1f} MB of {about['max_bytes'] / 1e9:g} GB cap"
    lines = [f"token cache {about['dir']}: {size}, {sum(s['segments'] for s in about['namespaces'])} segments"]
    for s in about["namespaces"]:
        lines.append(f"  {s['namespace']}: {s['segments']} segments, {s['bytes'] / 1e6:,.1f} MB "
                     f"(tokenizer sha256 {str(s['tokenizer_sha256'])[:12]}, tokenizers {s['tokenizers']})")
    parsed = about["parsed_chunks"]
    lines.append(f"  parsed input chunks: {parsed['files']}, {parsed['bytes'] / 1e6:,.1f} MB")
    if about["hit_rate"] is not None:
        lines.append(f"hit rate over {about['runs_logged']} logged runs: {about['hit_rate']:.1%} of distinct texts")
    for r in about["last_runs"]:
        when = datetime.datetime.fromtimestamp(r.get("time", 0)).strftime("%Y-%m-%d %H:%M")
        lines.append(f"  {when}: {r.get('strings', 0):,} texts, {r.get('distinct', 0):,} distinct, "
                     f"{r.get('from_cache', 0):,} from the cache ({r.get('hit_rate', 0):.1%}), "
                     f"{r.get('tokenized', 0):,} tokenized; {r.get('tokens_from_cache', 0):,} tokens read back")
    return "\n".join(lines)
