"""The Ray driver's side of the parts: merge the workers' counts, rename their staged parts into
place and record them, so DST ends as the local engine leaves it.

Final names are numbered densely per folder in (file, chunk, part) order: the order in which the
local engine writes them, so with the same `chunk_bytes` the two engines name (and write) the
same files, and two Ray runs give byte-identical output whatever order their tasks ran in.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from etl.cache.encoder import EncodeStats
from etl.engine.chunks import CHUNK, FILE
from etl.engine.worker import BACKEND, CACHE, COUNTS, PARTS, TIMINGS
from etl.output.part_writer import PartWriter
from etl.pipeline.accounting import Counts
from etl.safe_paths import check_no_symlink
from etl.tokens.gigatoken_encoder import HF


def merge_counts(results: list[dict[str, Any]]) -> Counts:
    """The run's counts: the sum of every chunk's, inputs not read to the end in file order."""
    counts = Counts()
    for result in sorted(results, key=lambda r: (r[FILE], r[CHUNK])):
        counts.add(Counts.from_json(json.loads(result[COUNTS])))
    return counts


def merge_timings(results: list[dict[str, Any]]) -> Counter[str]:
    """Worker seconds per stage, summed over the chunks (CPU-side, not wall time)."""
    total: Counter[str] = Counter()
    for result in results:
        total.update(json.loads(result[TIMINGS]))
    return total


def merge_cache_stats(results: list[dict[str, Any]]) -> EncodeStats:
    """The workers' token cache counts, summed over the chunks."""
    total = EncodeStats()
    for result in results:
        total.add(EncodeStats(**json.loads(result[CACHE])))
    return total


def merge_backends(results: list[dict[str, Any]]) -> str | None:
    """The tokenizer backend the workers encoded with (`hf` if any worker fell back to it; None
    when no worker tokenized a text)."""
    used = {result[BACKEND] for result in results} - {None}
    return HF if HF in used else (used.pop() if used else None)


def commit_parts(parts: PartWriter, staging: Path, results: list[dict[str, Any]]) -> None:
    """Journal each staged part's final name, rename it there and record it (`parts.place`);
    remove staging.

    A kill between two renames leaves the journal listing both the staging folder and every final
    name reserved so far: the rerun removes them all, and no manifest was written.
    """
    staged = []
    for result in results:
        for entry in json.loads(result[PARTS]):
            staged.append(((entry["folder"], result[FILE], result[CHUNK], entry["path"]), entry))
    for (folder, *_), entry in sorted(staged, key=lambda item: item[0]):
        parts.place(folder, staging / entry["path"], rows=entry["rows"], sha256=entry["sha256"])
    assert parts.output is not None
    shutil.rmtree(check_no_symlink(staging, parts.output.root))
