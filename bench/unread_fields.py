"""Benchmark: what the unread-message-field check (`etl.formats.unread_fields`) adds to parsing.

T0-train-50k (../shared/data, 55k rows) is rewritten as chat records (every 7th user message
with a `name`, which etl does not read) into one JSONL file and into shards of `--shard-rows`
records; the chat builder then runs over every chunk, the check's own time summed apart.
The check samples each file's first 1,000 records, so many small files are its worst case.

    python bench/unread_fields.py [--shard-rows N] [--repeat R]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import duckdb

from etl.formats import unread_fields
from etl.formats.builders import BUILDERS, run_builder
from etl.ingest.discover import discover
from etl.ingest.reader import read_chunks

T0 = Path(__file__).resolve().parents[2] / "shared" / "data" / "t0-train-50k" / "t0_train_50k_per_template.jsonl.gz"
ROLES = ["system", "user", "assistant", "tool"]


def write_chat(tmp: Path, shard_rows: int) -> tuple[Path, Path]:
    """T0 as chat JSONL: one file, and the same records in shards of `shard_rows`."""
    with gzip.open(T0, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    lines = [json.dumps({"messages": [{"role": "user", "content": r["prompt"], **({"name": "u"} if i % 7 == 0 else {})},
                                      {"role": "assistant", "content": r["completion"]}]})
             for i, r in enumerate(rows)]
    (tmp / "one.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp / "shards").mkdir()
    for at in range(0, len(lines), shard_rows):
        (tmp / "shards" / f"{at // shard_rows:05d}.jsonl").write_text("\n".join(lines[at:at + shard_rows]) + "\n")
    return tmp / "one.jsonl", tmp / "shards"


def measure(src: Path, repeat: int) -> str:
    """Median seconds of the builder over every chunk of `src`, check included, and the check's share."""
    chunks = [c for s in discover(str(src)) for c in read_chunks(s)]
    check = unread_fields.UnreadFields.check
    spent = [0.0]

    def timed(self: unread_fields.UnreadFields, con: duckdb.DuckDBPyConnection, raw: object) -> None:
        start = time.perf_counter()
        check(self, con, raw)  # type: ignore[arg-type]
        spent[0] += time.perf_counter() - start

    unread_fields.UnreadFields.check = timed  # type: ignore[method-assign]
    con, totals, checks = duckdb.connect().cursor(), [], []
    for _ in range(repeat):
        query, spent[0] = BUILDERS["chat"](roles=ROLES), 0.0
        start = time.perf_counter()
        for chunk in chunks:
            run_builder(con, chunk, query)
        totals.append(time.perf_counter() - start)
        checks.append(spent[0])
    unread_fields.UnreadFields.check = check  # type: ignore[method-assign]
    total, spent_s = statistics.median(totals), statistics.median(checks)
    return (f"{src.name}: {len(chunks)} chunks, builder {total:.2f} s with the check, "
            f"check {spent_s * 1000:.0f} ms ({100 * spent_s / total:.2f}%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shard-rows", type=int, default=110)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # one `name` warning per repeat
    with tempfile.TemporaryDirectory() as tmp:
        for src in write_chat(Path(tmp), args.shard_rows):
            print(measure(src, args.repeat))


if __name__ == "__main__":
    main()
