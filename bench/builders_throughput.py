"""Benchmark: MB/s of JSON text each record builder validates and normalizes (DuckDB only).

T0-train-50k (../shared/data, 55k rows, ~65 MB of JSON) is rewritten once per input format
(chat, chat with content parts, sharegpt, instruction/alpaca, prompt_completion, text, and an
HH-RLHF-style transcript) into a temp dir, read into memory with `etl.ingest.reader.read_chunks`,
then each builder runs over the chunks; reading is not timed. Goal: every builder under ~1 s
per 65 MB.

    python bench/builders_throughput.py [--rows N] [--repeat R]
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

from etl.formats.builders import BUILDERS, run_builder
from etl.ingest.discover import discover
from etl.ingest.reader import read_chunks

T0 = Path(__file__).resolve().parents[2] / "shared" / "data" / "t0-train-50k" / "t0_train_50k_per_template.jsonl.gz"
ROLES = ("system", "user", "assistant", "tool", "text")

Shape = Callable[[str, str], dict[str, Any]]
FORMATS: dict[str, tuple[str, dict[str, Any], Shape]] = {
    "chat": ("chat", {}, lambda p, c: {"messages": [
        {"role": "user", "content": p}, {"role": "assistant", "content": c}]}),
    "chat_parts": ("chat", {"weight_key": "loss_weight"}, lambda p, c: {"messages": [
        {"role": "user", "content": [{"type": "text", "value": p}], "loss_weight": 0.0},
        {"role": "assistant", "content": [{"type": "text", "value": c}], "loss_weight": 1.0}]}),
    "sharegpt": ("sharegpt", {}, lambda p, c: {"conversations": [
        {"from": "human", "value": p}, {"from": "gpt", "value": c}], "system": "Be brief."}),
    "instruction": ("instruction", {}, lambda p, c: {"instruction": p, "input": "", "output": c}),
    "prompt_completion": ("prompt_completion", {"strip_suffix": "<|endoftext|>"},
                          lambda p, c: {"prompt": p, "completion": c}),
    "text": ("text", {}, lambda p, c: {"text": p + c}),
    "transcript": ("transcript", {}, lambda p, c: {"chosen": f"\n\nHuman: {p}\n\nAssistant: {c}"}),
}


def write_inputs(rows: int | None, out: Path) -> dict[str, Path]:
    """One JSONL file per format from the same T0 rows."""
    paths = {name: out / f"{name}.jsonl" for name in FORMATS}
    files = {name: path.open("w", encoding="utf-8") for name, path in paths.items()}
    with gzip.open(T0, "rt", encoding="utf-8") as src:
        for i, line in enumerate(src):
            if rows is not None and i >= rows:
                break
            rec = json.loads(line)
            for name, (_, _, shape) in FORMATS.items():
                files[name].write(json.dumps(shape(rec["prompt"], rec["completion"]), ensure_ascii=False) + "\n")
    for fh in files.values():
        fh.close()
    return paths


def bench(path: Path, builder: str, options: dict[str, Any], repeat: int) -> tuple[float, float, float, int]:
    """(MB of JSON, best wall and CPU seconds over `repeat` runs, rejected + dropped rows).

    CPU seconds (all DuckDB threads) barely move when other jobs share the cores; wall does.
    """
    chunks = [c for s in discover(str(path)) for c in read_chunks(s)]
    mb = sum(c.column("line").nbytes for c in chunks) / 1e6
    con = duckdb.connect()
    query = BUILDERS[builder](roles=ROLES, **options)
    best, cpu, bad = float("inf"), float("inf"), 0
    for _ in range(repeat):
        started, cpu_started = time.perf_counter(), time.process_time()
        out = [run_builder(con, c, query) for c in chunks]
        best = min(best, time.perf_counter() - started)
        cpu = min(cpu, time.process_time() - cpu_started)
        bad = sum(t.num_rows - t.column("reason").null_count for t in out)
    return mb, best, cpu, bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_inputs(args.rows, Path(tmp))
        print(f"{'format':<18} {'MB':>6} {'wall s':>7} {'MB/s':>6} {'s/65MB':>7} {'cpu s':>6} {'bad':>5}")
        for name, (builder, options, _) in FORMATS.items():
            mb, secs, cpu, bad = bench(paths[name], builder, options, args.repeat)
            print(f"{name:<18} {mb:6.1f} {secs:7.2f} {mb / secs:6.0f} {secs * 65 / mb:7.2f} {cpu:6.2f} {bad:5d}")


if __name__ == "__main__":
    main()
