"""Token-balanced ranks: max/min real tokens per step across 8 simulated ranks on T0, with and
without `ParquetLoader(balance=True)`, padded and packed.

    python bench/token_balance.py [DST] [--batch-size 8] [--world-size 8] [--seed 0]

Without DST it builds T0-train-50k once (`etl run ... --input-type prompt_completion --tokenizer
qwen2.5 --template chatml`, S = 2048, ~20 s) under --cache. Every rank is a real `ParquetLoader`
(rank r of W) and its epoch-0 batches come from its sampler; no token is read. A row's real tokens
are min(num_tokens, S), a pack's the sum of its pieces (before the x/y shift). Per step: the
largest rank's tokens over the smallest's; the table gives their mean, median, 99th percentile
and worst over the epoch, the steps above 1.05, and "floor > 1.05": the steps whose rows no
dealing can bring to 1.05 (`imbalance_floor`). `results()` returns the rows (for bench/results.py).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from etl.loader import ParquetLoader, SamplerOptions, TokenBalance
from etl.loader.balance import imbalance, imbalance_floor

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"
T0 = Path("t0-train-50k") / "t0_train_50k_per_template.jsonl.gz"
QWEN = Path("qwen2.5-tokenizer")
CACHE = Path(tempfile.gettempdir()) / "etl-bench"
# (mode, shuffle_window, loader options): shuffle_window 8 (row-group blocks) is the loader's
# default; None shuffles the whole split.
CONFIGS: list[tuple[str, int | None, dict[str, Any]]] = [
    (mode, window, {**extra, **balance})
    for mode, extra in (("padded", {}), ("packed bfd", {"packing": "bfd"}))
    for window in ((8, None) if mode == "padded" else (8,))
    for balance in ({}, {"balance": TokenBalance(window=1)}, {"balance": TokenBalance()})
]


def build_t0(shared: Path, cache: Path) -> Path:
    """T0 through `etl run` (prompt_completion, Qwen2.5, chatml, S = 2048), once per cache."""
    dst = cache / "t0-token-balance"
    if not (dst / "_manifest.json").is_file():
        cmd = [sys.executable, "-m", "etl", "run", str(shared / T0), str(dst), "--quiet",
               "--input-type", "prompt_completion", "--tokenizer", str(shared / QWEN),
               "--template", "chatml"]
        subprocess.run(cmd, check=True)
    return dst


def rank_tokens(dst: Path, *, world_size: int, **options: Any) -> tuple[np.ndarray, np.ndarray, float]:
    """Epoch 0 on every simulated rank: (steps, W) tokens per rank, (steps, W * B) tokens of each
    step's items, and the seconds rank 0's sampler took to lay out the epoch."""
    per_rank, items, seconds = [], [], 0.0
    for rank in range(world_size):
        with warnings.catch_warnings():  # T0's S is the run's; no seq_len note expected
            warnings.simplefilter("ignore")
            loader = ParquetLoader(dst, rank=rank, world_size=world_size, **options)
        sampler = loader.sampler
        started = time.perf_counter()
        batches = sampler.batches(0)
        seconds = seconds or time.perf_counter() - started
        if "packing" in options:
            costs = sampler.packing(0).pack_tokens()
        else:
            costs = np.minimum(loader.dataset.example_lengths(), loader.seq_len)
        per_rank.append([int(costs[b].sum()) for b in batches])
        items.append([costs[b] for b in batches])
    step_items = np.array([np.concatenate([r[s] for r in items]) for s in range(len(items[0]))])
    return np.array(per_rank).T, step_items, seconds


def results(
    dst: Path | None = None,
    *,
    batch_size: int = 8,
    world_size: int = 8,
    seed: int = 0,
    shared: Path = SHARED,
    cache: Path = CACHE,
) -> list[dict[str, Any]]:
    """One row per configuration of `CONFIGS`: mode, shuffle, balance, B, W, steps, mean, p50,
    p99, worst (max/min tokens per step), over_105 and floor_over_105 (steps), layout_ms."""
    dst = dst or build_t0(shared, cache)
    rows = []
    for mode, shuffle_window, options in CONFIGS:
        loads, step_items, seconds = rank_tokens(dst, world_size=world_size, batch_size=batch_size,
                                                 seed=seed, sampler=SamplerOptions(shuffle_window=shuffle_window),
                                                 **options)
        ratio = imbalance(loads)
        balance = "off" if "balance" not in options else f"on, window {options['balance'].window}"
        rows.append({
            "mode": mode, "shuffle": "full" if shuffle_window is None else f"blocks of {shuffle_window} row groups",
            "balance": balance, "B": batch_size, "W": world_size, "steps": len(ratio),
            # Rounded here: bench/results.py prints these values as they are.
            "mean": round(float(ratio.mean()), 4), "p50": round(float(np.median(ratio)), 4),
            "p99": round(float(np.percentile(ratio, 99)), 3), "worst": round(float(ratio.max()), 3),
            "over_105": int((ratio > 1.05).sum()),
            "floor_over_105": int((imbalance_floor(step_items, world_size=world_size) > 1.05).sum()),
            "layout_ms": round(1e3 * seconds, 1),
        })
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table."""
    head = ("| mode | shuffle | balance | steps | mean | p50 | p99 | worst | steps > 1.05 "
            "| floor > 1.05 | epoch layout ms |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    body = [f"| {r['mode']} | {r['shuffle']} | {r['balance']} | {r['steps']} | {r['mean']:.4f} | "
            f"{r['p50']:.4f} | {r['p99']:.3f} | {r['worst']:.3f} | {r['over_105']} | "
            f"{r['floor_over_105']} | {r['layout_ms']:.0f} |" for r in rows]
    return "\n".join([head, *body])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dst", nargs="?", type=Path, help="an `etl run` output (default: T0, built once)")
    p.add_argument("--batch-size", type=int, default=8, help="B, rows or packs per rank and step")
    p.add_argument("--world-size", type=int, default=8, help="simulated ranks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shared", type=Path, default=SHARED, help="the shared data folder (T0, Qwen2.5)")
    p.add_argument("--cache", type=Path, default=CACHE, help="where the T0 output is built")
    args = p.parse_args()
    if args.dst is None and not (args.shared / T0).is_file():
        print(f"no T0 under {args.shared}; pass an `etl run` output as DST", file=sys.stderr)
        return 2
    rows = results(args.dst, batch_size=args.batch_size, world_size=args.world_size, seed=args.seed,
                   shared=args.shared, cache=args.cache)
    print(f"max/min real tokens per step across {args.world_size} ranks, B={args.batch_size}, "
          f"seed {args.seed}, epoch 0\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
