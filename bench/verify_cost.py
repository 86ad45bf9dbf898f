"""What verifying an output costs a reader: sha256 of its parts, and the loader's start-up with and
without the check (etl.output.parts, etl.output.verify).

    python bench/verify_cost.py DST [--split train]

Prints GB hashed, seconds per GB on one thread and on the readers' thread pool, and
`ParquetDataset(DST)` start-up: checked (first open in the process), checked again (digests kept
per process) and with the sha256 step skipped. Files are read once first, so every figure is from
the page cache (a cold read adds the disk's own time, which the training reads pay anyway).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from etl.columns import DATA_DIR
from etl.loader.dataset import ParquetDataset
from etl.output import parts
from etl.output.manifest import read_manifest
from etl.output.ownership import sha256_file


def _timed(fn: object) -> float:
    started = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dst")
    ap.add_argument("--split", default="train")
    args = ap.parse_args()
    files = [Path(args.dst) / e["path"] for e in read_manifest(args.dst)["files"]
             if e["path"].startswith(f"{DATA_DIR}/{args.split}/")]
    gb = sum(f.stat().st_size for f in files) / 1e9
    for f in files:  # into the page cache
        f.read_bytes()
    one = _timed(lambda: [sha256_file(f) for f in files])
    parts._DIGESTS.clear()
    pool = _timed(lambda: parts.listed_parts(args.dst, f"{DATA_DIR}/{args.split}"))
    parts._DIGESTS.clear()
    checked = _timed(lambda: ParquetDataset(args.dst, split=args.split, min_tokens=0))
    again = _timed(lambda: ParquetDataset(args.dst, split=args.split, min_tokens=0))
    real = parts.check_digest
    parts.check_digest = lambda *a, **k: None  # the start-up without the sha256 step
    try:
        parts._DIGESTS.clear()
        unchecked = _timed(lambda: ParquetDataset(args.dst, split=args.split, min_tokens=0))
    finally:
        parts.check_digest = real
    print(f"{len(files)} parts, {gb:.3f} GB")
    print(f"sha256, 1 thread:           {one:.2f} s  ({one / gb:.2f} s/GB)")
    print(f"listed_parts (pool of {parts.HASH_THREADS}): {pool:.2f} s  ({pool / gb:.2f} s/GB)")
    print(f"ParquetDataset start-up: checked {checked:.2f} s, checked again {again:.3f} s, "
          f"without sha256 {unchecked:.3f} s")


if __name__ == "__main__":
    main()
