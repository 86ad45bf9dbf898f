"""The token cache lies apart from a run's inputs and output, checked before anything is written.

A cache inside SRC is read back as input by the next run (its runs.jsonl, key.json and segments
look like data: 20 records became 63); one inside DST mixes with etl's output and makes DST look
foreign; SRC or DST inside the cache sits among files `etl cache clear` empties. Paths are
compared resolved. A URI SRC (s3://, gs://) cannot overlap a local cache; file:// is its path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from etl.cache.folder import CacheSettings
from etl.errors import EtlError
from etl.ingest.discover import hidden, is_uri, source_root
from etl.ingest.location import local_or_none
from etl.tokens.tokenizer import BYTES


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _input_place(src: str) -> Path | None:
    """What SRC reads: a file itself, else the folder it lists (a glob's base); None: an object store."""
    if is_uri(src):
        if (path := local_or_none(src)) is None:
            return None
        src = str(path)
    return Path(src).resolve() if Path(src).is_file() else source_root(src).resolve()


def _overlap(cache: Path, shown: Path, src: str, place: Path) -> str | None:
    """How the cache (`shown` as the user gave it) and one input overlap, or None. A cache in a
    hidden or underscore-prefixed folder of SRC is never listed as input (`etl.ingest.discover`),
    so `etl run ~ d` keeps the default ~/.cache/etl/tokens."""
    if place == cache:
        return f"the token cache {shown} is SRC {src}"
    if _inside(place, cache):
        return f"SRC {src} lies inside the token cache {shown}"
    if place.is_dir() and _inside(cache, place) and not any(hidden(p) for p in cache.relative_to(place).parts):
        return f"the token cache {shown} lies inside SRC {src}: the next run would read it as input"
    return None


def check_apart(cache: CacheSettings | None, srcs: Sequence[str], dst: Path, *, tokenizer: str) -> None:
    """Refuse a cache that overlaps SRC (each of a mixture's) or DST, before any file is written
    (the `bytes` tokenizer leaves the cache alone: nothing to refuse).

    Raises:
        EtlError: one line naming the cache and the overlap.
    """
    if cache is None or cache.root is None or tokenizer == BYTES:
        return
    root, out, shown = cache.root.resolve(), dst.resolve(), cache.root
    found = None
    if _inside(root, out) or _inside(out, root):
        where = "is DST" if root == out else "lies inside DST" if _inside(root, out) else "holds DST"
        found = f"the token cache {shown} {where} {dst}"
    for src in srcs:
        place = _input_place(src)
        found = found or (_overlap(root, shown, src, place) if place is not None else None)
    if found:
        raise EtlError(f"{found}; keep the cache apart from SRC and DST: pass another --cache DIR (or set "
                       "$ETL_CACHE_DIR), or --no-cache")
