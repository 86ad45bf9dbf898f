"""Benchmark: two steps of the hot path, each next to the code it replaced.

(a) Copying token ids out of `tokenizers` Encodings into numpy (`flatten_ids`) on T0 (Qwen2.5,
    batches of ENCODE_CHUNK texts as the pipeline makes them), next to the tokenizer call itself.
(b) `Deduplicator.keep` over many chunks of random keys, next to the sorted-array version.

    python bench/hot_path.py [--rows N] [--tokenizer DIR] [--chunks C] [--keys K]

Copy times are the thread's CPU seconds (the copy runs on one thread; CPU time keeps a busy
machine's noise out), the tokenizer call's are wall seconds (it runs on every thread).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from etl.ingest.preprocess import Deduplicator
from etl.tokens.hf_tokenizer import ENCODE_CHUNK, flatten_ids

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
T0 = SHARED / "t0-train-50k" / "t0_train_50k_per_template.jsonl.gz"
QWEN = SHARED / "qwen2.5-tokenizer"


def t0_texts(rows: int | None) -> list[str]:
    """Prompts and completions of the first `rows` T0 rows, in order (what etl_throughput encodes)."""
    texts: list[str] = []
    with gzip.open(T0, "rt", encoding="utf-8") as src:
        for line in itertools.islice(src, rows):
            rec = json.loads(line)
            texts += [rec["prompt"], rec["completion"]]
    return texts


def flatten_before(batch: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The copy `flatten_ids` replaced: every `.ids` list first, then one `np.fromiter` pass."""
    ids = [enc.ids for enc in batch]
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    return np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum())), lengths


def cpu_seconds(fn: Callable[[Any], Any], arg: Any) -> tuple[float, Any]:
    """(this thread's CPU seconds, result) of fn(arg)."""
    started = time.thread_time()
    out = fn(arg)
    return time.thread_time() - started, out


def bench_flatten(texts: list[str], tokenizer: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    tok.encode_special_tokens = True
    call = before = after = 0.0
    tokens = 0
    for n, i in enumerate(range(0, len(texts), ENCODE_CHUNK)):
        started = time.perf_counter()
        batch = tok.encode_batch_fast(texts[i : i + ENCODE_CHUNK], add_special_tokens=False)
        call += time.perf_counter() - started
        runs = [(flatten_before, "before"), (flatten_ids, "after")]
        results = {}
        for fn, name in runs if n % 2 else runs[::-1]:  # alternate which one runs first
            results[name] = cpu_seconds(fn, batch)
        (before_s, old), (after_s, new) = results["before"], results["after"]
        if not (np.array_equal(old[0], new[0]) and np.array_equal(old[1], new[1])):
            raise SystemExit(f"flatten_ids differs from the old copy in batch {n}")
        before, after, tokens = before + before_s, after + after_s, tokens + len(new[0])
    print(f"T0 ids copy: {len(texts):,} texts, {tokens:,} tokens, batches of {ENCODE_CHUNK}")
    print(f"  tokenizer call (encode_batch_fast): {call:7.2f} s wall")
    for name, sec in (("before (lists, then fromiter)", before), ("after (flatten_ids)", after)):
        print(f"  ids -> numpy, {name:29s}: {sec:7.3f} s cpu  {sec / tokens * 1e9:5.1f} ns/token")


class DeduplicatorBefore:
    """The `Deduplicator` this replaced: a sorted array merged with every chunk."""

    def __init__(self) -> None:
        self.seen = np.zeros(0, dtype=np.uint64)

    def keep(self, keys: np.ndarray) -> np.ndarray:
        _, first = np.unique(keys, return_index=True)
        first_here = np.zeros(len(keys), dtype=bool)
        first_here[first] = True
        fresh = first_here & ~np.isin(keys, self.seen)
        self.seen = np.union1d(self.seen, keys)
        return fresh


def dedup_chunks(chunks: int, keys: int, repeat: float, seed: int = 0) -> list[np.ndarray]:
    """`chunks` arrays of `keys` MD5-like uint64 keys, about `repeat` of them seen before."""
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 2**64 - 1, size=max(1, int(chunks * keys * (1 - repeat))), dtype=np.uint64)
    return [pool[rng.integers(0, len(pool), keys)] for _ in range(chunks)]


def run_dedup(dedup: Any, chunks: list[np.ndarray]) -> tuple[float, float, list[np.ndarray]]:
    """(CPU seconds in all, of the last chunk, the masks) of `dedup.keep` over the chunks."""
    total, last, masks = 0.0, 0.0, []
    for keys in chunks:
        last, mask = cpu_seconds(dedup.keep, keys)
        total += last
        masks.append(mask)
    return total, last, masks


def bench_dedup(chunks: int, keys: int, repeat: float) -> None:
    data = dedup_chunks(chunks, keys, repeat)
    after_s, after_last, after = run_dedup(Deduplicator(), data)
    before_s, before_last, before = run_dedup(DeduplicatorBefore(), data)
    if any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True)):
        raise SystemExit("Deduplicator.keep differs from the sorted-array version")
    kept = sum(int(m.sum()) for m in after)
    print(f"dedup keep(): {chunks} chunks x {keys:,} keys ({repeat:.0%} repeats), {kept:,} kept")
    for name, sec, last in (("before (sorted array)", before_s, before_last), ("after (hash table)", after_s, after_last)):
        print(f"  {name:22s}: {sec:8.2f} s cpu  last chunk {last * 1e3:8.2f} ms")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=None, help="first N rows of T0 (default all 55,185)")
    p.add_argument("--tokenizer", type=Path, default=QWEN)
    p.add_argument("--chunks", type=int, default=60, help="dedup chunks (default 60: the old quadratic keep() takes ~4 min at 200)")
    p.add_argument("--keys", type=int, default=10_000, help="dedup keys per chunk (default 10,000)")
    p.add_argument("--repeat", type=float, default=0.3, help="share of dedup keys seen before (default 0.3)")
    args = p.parse_args()
    if not T0.exists() or not args.tokenizer.exists():
        print(f"benchmark data not found ({T0}, {args.tokenizer}); it lives in ../shared/data", file=sys.stderr)
    else:
        bench_flatten(t0_texts(args.rows), args.tokenizer)
    bench_dedup(args.chunks, args.keys, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
