"""What `etl run` resolves before the tokenizer: the preset template and the parse query.

Parsing needs neither Polars nor the tokenizer, so `etl run` starts it from what this module
gives and loads those while DuckDB parses the first chunk (DuckDB runs without the GIL; the
imports and `Tokenizer.from_str` hold it). Keep this module's imports light: DuckDB, pyarrow,
numpy and pydantic are all the first parse needs (what they cost: docs/design.md, Start-up).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import time

from etl.columns import AUTO_TEMPLATE
from etl.config.run_config import RunConfig
from etl.formats.builders import BuilderQuery, build_query
from etl.tokens.loading import has_chat_template
from etl.tokens.templates import HF, NGPT, Template, preset

# `etl run --timings` key: seconds from the process's start to the first record's parse.
STARTUP = "startup"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def preset_template(config: RunConfig) -> Template | None:
    """The preset template `config.template` names (`auto`: ngpt when the tokenizer has no
    chat_template); None for `hf`, or `auto` with a chat_template, which need the tokenizer."""
    name = config.template
    if name == AUTO_TEMPLATE:
        name = HF if has_chat_template(config.tokenizer) else NGPT
    return None if name == HF else preset(name)


def builder_query_for(cfg: RunConfig, template: Template) -> BuilderQuery:
    """The parse query of the run's input type over a template's roles (`text` is a role only
    for text input, which has no chat turns). It needs no tokenizer."""
    roles = [r for r in ("text", *template.roles) if r != "text" or cfg.input_type == "text"]
    return build_query(
        cfg.input_type, roles=roles, options=cfg.input_options, max_record_bytes=cfg.max_record_bytes,
        template_tools=template.tools is not None,
    )


def process_age() -> float | None:
    """Seconds since this process started (Linux: /proc, 10 ms steps); None where unknown."""
    try:
        with open("/proc/self/stat", "rb") as f:
            started = int(f.read().rsplit(b")", 1)[1].split()[19]) / _CLOCK_TICKS
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return None


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
# bytes: allocations this large get their own pages, freed at once. Above a chunk's ids (~14 MiB
# for 16 MiB of chat), so those come back from the heap; at 1 MiB every one was fresh pages,
# zeroed by the kernel: 7.9 s of system time on T0 x10 against 4.8 s (bench/scale.py). 32 MiB
# (the raw block from the heap too) ran T0 x10 ~6% faster but peaked at 922-949 MiB against
# ~850-880: too near the 1 GiB that run must stay under (bench/results.md, Speed at scale).
MMAP_THRESHOLD = 16 << 20
ARENA_MAX = 2


def tune_malloc() -> None:
    """Bound glibc's heap and put Arrow's buffers on it (Linux; elsewhere nothing).

    By default glibc raises its mmap threshold to the largest block freed so far (up to 32 MiB),
    where freed memory stays resident, fragmented across the threads' arenas. A fixed threshold
    (MMAP_THRESHOLD) and two arenas bound that. Arrow's own allocator (mimalloc) keeps the pages
    it freed to itself; on glibc's, Arrow's buffers (parsed chunks, Parquet pages) reuse the
    heap numpy's arrays left. T0 x10 (bench/scale.py; 1 MiB threshold and mimalloc before):
    wall 18.2 -> 16.1 s, system time 8.0 -> 4.8 s, peak RSS 1.08 -> 1.13 GiB (medians of 3,
    interleaved; docs/design.md, Measured costs). ARROW_DEFAULT_MEMORY_POOL, when set, wins.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    mallopt(_M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD)
    mallopt(_M_ARENA_MAX, ARENA_MAX)
    if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ:
        import pyarrow as pa  # already imported by the parse's modules

        pa.set_memory_pool(pa.system_memory_pool())
