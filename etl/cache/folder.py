"""Where the token cache lives, what it may hold and how it is emptied: `etl cache info|clear`.

    <root>/ETL_TOKEN_CACHE        marker: etl made this folder, and removes only its own files
    <root>/runs.jsonl             one line per run: strings, hits, tokens, seconds (hit rates)
    <root>/<namespace>/key.json   what the ids of that folder depend on (tokenizer sha256, ...)
    <root>/<namespace>/answers.json   the tokenizer's answers to a run's small questions (special
                                  ids, template pieces' ids): a rerun need not parse tokenizer.json
    <root>/<namespace>/<sha256>.parquet   segments (`etl.cache.segments`)
    <root>/parsed/<key>.<sha256>.arrow    parsed input chunks (`etl.cache.parsed`)

The root is `--cache DIR`, else $ETL_CACHE_DIR; with neither, `etl run` keeps no cache (`etl cache`
looks at ~/.cache/etl/tokens, where earlier releases kept it by default). Its size is capped
(`--cache-max-gb`, $ETL_CACHE_MAX_GB, default 4 GB): when a run ends the least recently used
segments and parsed chunks go first. Nothing without the marker, and nothing but etl's own
names, is ever removed; nothing below the root is written or removed through a symlink
(`etl.cache.guard`: a run then goes on without the cache, `clear` refuses).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etl.cache.guard import TMP_PREFIX, CacheGuard, append_line, make_dir, remove, write_file
from etl.errors import EtlError
from etl.safe_paths import check_no_symlink

ENV_DIR, ENV_MAX_GB = "ETL_CACHE_DIR", "ETL_CACHE_MAX_GB"
DEFAULT_MAX_GB = 4.0
MARKER = "ETL_TOKEN_CACHE"
RUNS_LOG, KEY_FILE, ANSWERS_FILE = "runs.jsonl", "key.json", "answers.json"
LOG_KEEP = 1000  # runs the log keeps (~200 B each)
STALE_TMP_SECONDS = 24 * 3600  # a temporary file this old is a crashed writer's, not a live one's
SEGMENT_NAME = re.compile(r"^[0-9a-f]{64}\.parquet$")  # <sha256 of its bytes>.parquet
PARSED_DIR, PARSED_SUFFIX = "parsed", ".arrow"
PARSED_NAME = re.compile(r"^[0-9a-f]{40}\.[0-9a-f]{64}\.arrow$")  # <chunk key>.<sha256 of its bytes>.arrow


def is_segment(path: Path) -> bool:
    return SEGMENT_NAME.match(path.name) is not None


@dataclass(frozen=True)
class CacheSettings:
    """Where the cache is (None: --no-cache), its size cap in bytes, and whether this run still
    uses it (`guard`: off after a failed write; one settings object per run)."""

    root: Path | None
    max_bytes: int = int(DEFAULT_MAX_GB * 1e9)
    guard: CacheGuard = field(default_factory=CacheGuard, compare=False, repr=False)

    # Why no folder means no cache (docs/token-cache.md): with gigatoken encoding ~40x faster than
    # `tokenizers`, the ids a warm run reads back save less than the cache costs. On all of T0
    # (Qwen2.5, `python bench/token_cache.py --rounds 2`) filling it made a first run 7.4% slower,
    # and a warm rerun at another --seq-len was 1.66x faster than a run without it: short of the
    # 5% and 3x that would earn it a default (the lookup, reading parsed chunks back, the plan,
    # the assembly and the write remain).
    @classmethod
    def resolve(cls, folder: str | None = None, *, disabled: bool = False, max_gb: float | None = None) -> CacheSettings:
        """--cache DIR / --no-cache / --cache-max-gb, else $ETL_CACHE_DIR and $ETL_CACHE_MAX_GB; with
        neither folder, no cache."""
        named = folder or os.environ.get(ENV_DIR)
        root = None if disabled or not named else Path(named).expanduser()
        return cls(root, max_bytes(max_gb))


def lazy_tokenizer(cache: CacheSettings | None) -> bool:
    """With a cache folder, tokenizer.json is parsed only when a question or a text is not cached."""
    return cache is not None and cache.root is not None


def default_root() -> Path:
    """The folder `etl cache info|clear` look at without --cache: $ETL_CACHE_DIR, else where
    earlier releases kept the cache by default."""
    return Path(os.environ.get(ENV_DIR) or Path.home() / ".cache" / "etl" / "tokens").expanduser()


def max_bytes(max_gb: float | None = None) -> int:
    """The size cap in bytes: the flag's, else $ETL_CACHE_MAX_GB's, else 4 GB."""
    if max_gb is None:
        raw = os.environ.get(ENV_MAX_GB)
        try:
            max_gb = float(raw) if raw else DEFAULT_MAX_GB
        except ValueError:
            raise EtlError(f"{ENV_MAX_GB}={raw!r} is not a number of GB; set it to e.g. 4, or unset it") from None
    if max_gb < 0:
        raise EtlError(f"the token cache's size cap must be >= 0 GB, got {max_gb}")
    return int(max_gb * 1e9)


def is_cache(root: Path) -> bool:
    return (root / MARKER).is_file()


def open_root(root: Path) -> Path:
    """The cache root, made (with its marker) when missing.

    Raises:
        EtlError: `root` is a file, or a folder that holds other files and is not a token cache.
        SymlinkRefused, OSError: the marker is a link, or cannot be written (`CacheGuard.attempt`
            turns the cache off for the run).
    """
    if root.exists() and not root.is_dir():
        raise EtlError(f"token cache {root} is a file; pass a folder to --cache (or --no-cache)")
    check_no_symlink(root / MARKER, root)
    if root.is_dir() and not is_cache(root) and any(root.iterdir()):
        raise EtlError(f"token cache {root} holds files and is not an etl token cache (no {MARKER}); pass a new "
                       "or empty folder to --cache, or --no-cache")
    root.mkdir(parents=True, exist_ok=True)
    if not is_cache(root):
        write_file(root / MARKER, b"etl token cache: `etl cache clear` empties it; safe to delete\n", root)
    return root


def namespace(root: Path, cache_key: str) -> Path:
    """The folder of one tokenizer and encoding: a digest of its key, the key written beside.

    Raises:
        SymlinkRefused: the folder, its key or its answers file is a link.
    """
    folder = make_dir(root / hashlib.sha256(cache_key.encode()).hexdigest()[:32], root)
    check_no_symlink(folder / ANSWERS_FILE, root)  # read at open, written at close
    key = check_no_symlink(folder / KEY_FILE, root)
    if not key.is_file():
        write_file(key, cache_key.encode(), root)
    return folder


def _digest(answers: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(answers, sort_keys=True).encode()).hexdigest()


def read_answers(folder: Path) -> dict[str, Any]:
    """The tokenizer answers a namespace holds; {} when there are none or the file fails its checksum."""
    try:
        saved = json.loads((folder / ANSWERS_FILE).read_text("utf-8"))
        answers = saved["answers"]
        return answers if isinstance(answers, dict) and saved["sha256"] == _digest(answers) else {}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def write_answers(folder: Path, answers: dict[str, Any], root: Path) -> None:
    """Add `answers` to the namespace's (a concurrent run's are kept: both are the same tokenizer's)."""
    merged = {**read_answers(folder), **answers}
    body = json.dumps({"sha256": _digest(merged), "answers": merged}, sort_keys=True)
    write_file(folder / ANSWERS_FILE, body.encode(), root)


def namespaces(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / KEY_FILE).is_file()) if root.is_dir() else []


def segments(root: Path) -> list[Path]:
    """Every segment of every namespace."""
    return [p for folder in namespaces(root) for p in sorted(folder.iterdir()) if is_segment(p)]


def parsed_files(root: Path) -> list[Path]:
    """Every parsed chunk."""
    folder = root / PARSED_DIR
    return sorted(p for p in folder.iterdir() if PARSED_NAME.match(p.name)) if folder.is_dir() else []


def evict(root: Path, limit: int) -> tuple[int, int]:
    """Remove the least recently used segments and parsed chunks until the cache holds at most
    `limit` bytes, and temporary files a crashed writer left a day ago; (files removed, bytes freed).

    Raises:
        SymlinkRefused: a file to remove, or a folder above it, is a link (nothing is removed through it).
    """
    now = time.time()
    for folder in [root, *namespaces(root), root / PARSED_DIR]:
        for p in folder.glob(f"{TMP_PREFIX}*"):
            with contextlib.suppress(FileNotFoundError):  # its writer renamed it just now
                if now - p.lstat().st_mtime > STALE_TMP_SECONDS:
                    remove(p, root)
    found = []
    for p in segments(root) + parsed_files(root):
        try:
            st = p.stat()
        except FileNotFoundError:  # another run evicted it just now
            continue
        found.append((st.st_mtime, p.name, st.st_size, p))
    total, removed, freed = sum(f[2] for f in found), 0, 0
    for _, _, size, path in sorted(found):
        if total - freed <= limit:
            break
        remove(path, root)
        removed, freed = removed + 1, freed + size
    return removed, freed


def log_run(root: Path, entry: dict[str, Any]) -> None:
    """Append one run's line (a single write of < 4 KiB: whole even beside another run's)."""
    log = root / RUNS_LOG
    if append_line(log, json.dumps(entry, sort_keys=True) + "\n", root) > LOG_KEEP * 400:
        lines = log.read_text("utf-8").splitlines(keepends=True)[-LOG_KEEP:]
        write_file(log, "".join(lines).encode(), root)


def runs(root: Path) -> list[dict[str, Any]]:
    """The logged runs, oldest first (a line a crash cut short is skipped)."""
    log = root / RUNS_LOG
    out = []
    for line in log.read_text("utf-8").splitlines() if log.is_file() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _owned(root: Path) -> tuple[list[Path], list[Path]]:
    """etl's files in the cache (segments, keys, answers, parsed chunks, temporary files) and the
    folders that hold them."""
    parsed = root / PARSED_DIR
    folders = [*namespaces(root), *([parsed] if parsed.is_dir() else [])]
    files = [p for folder in namespaces(root) for p in sorted(folder.iterdir())
             if is_segment(p) or p.name in (KEY_FILE, ANSWERS_FILE) or p.name.startswith(TMP_PREFIX)]
    files += parsed_files(root) + (sorted(parsed.glob(f"{TMP_PREFIX}*")) if parsed.is_dir() else [])
    return files + sorted(root.glob(f"{TMP_PREFIX}*")), folders


def clear(root: Path) -> tuple[int, int]:
    """Remove every segment, key, answers, parsed chunk, temporary file and the log; (files removed,
    bytes freed).

    Raises:
        EtlError: `root` is not a token cache (no marker), or a link lies where etl would remove
            (SymlinkRefused, naming it): nothing is removed.
    """
    if not root.is_dir():
        return 0, 0
    check_no_symlink(root / MARKER, root)
    if not is_cache(root):
        raise EtlError(f"{root} is not an etl token cache (no {MARKER} in it); nothing removed")
    files, folders = _owned(root)
    log = root / RUNS_LOG
    for p in [*files, *folders, log]:
        check_no_symlink(p, root)  # before the first removal: a link anywhere and nothing goes
    freed = sum(p.stat().st_size for p in files)
    for p in files:
        p.unlink(missing_ok=True)
    for folder in folders:
        if not any(folder.iterdir()):
            folder.rmdir()
    log.unlink(missing_ok=True)
    return len(files), freed
