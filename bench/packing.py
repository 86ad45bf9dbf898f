"""Benchmark: the packers on real T0 lengths: seconds, packs, utilization, packs over the bound.

Seconds are the best of --repeats calls, wall clock and this process's CPU time.

    python bench/packing.py [--sizes 100000 1000000] [--seq-len 2048] [--repeats 3] [--no-trl]

Lengths: the `num_tokens` column of T0-train-50k through `etl run` (Qwen2.5, chatml,
`--input-type prompt_completion --no-default-system`, `--seq-len S`), cached under --cache;
N lengths are drawn from it with replacement (seed 0). Utilization = real tokens / (packs x S);
"over bound" = packs over ceil(sum / S), the fewest packs possible. A last section packs the
first 20k T0 chats, the set the issue quotes TRL 1.16 on; TRL runs on the same lengths when
`trl` and `datasets` are importable. The last table is the loader's real tokens/s at B=32,
T=2048 in one process, padded vs packed (index and online), on that T0 output.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from etl.columns import DATA_DIR, NUM_TOKENS
from etl.errors import EtlWarning
from etl.loader.groups import PackOptions
from etl.packing.registry import pack

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"
T0_FILE = Path("t0-train-50k") / "t0_train_50k_per_template.jsonl.gz"
QWEN = Path("qwen2.5-tokenizer")
# (label, strategy, options): TRL's default `pack_dataset` windows are 1,000 rows.
STRATEGIES: list[tuple[str, str, dict[str, Any]]] = [
    ("bfd (global)", "bfd", {}),
    ("ffd (global)", "ffd", {}),
    ("bfd buffer_docs=1000", "bfd", {"buffer_docs": 1000}),
    ("sequential", "sequential", {}),
]
# The issue's figures for TRL 1.16 `pack_dataset(bfd)` on its T0 20k lengths at S=2048. Its set
# has a bound of 2,309 packs, ours (first 20k rows, no default system) 2,269: compare % over bound,
# or the TRL rows, which run on our lengths.
TRL_ISSUE = ("TRL 1.16 per the issue, on its own 20k set (bound 2,309): global 2,313 packs "
             "(+0.17%) in 0.31 s; 1,000-row windows 2,350 (+1.78%) in 0.58 s")


def t0_lengths(shared: Path, cache: Path, seq_len: int) -> np.ndarray:
    """`num_tokens` of every T0 row in file order, from a cached `etl run` (~30 s the first time)."""
    saved = cache / f"t0-lengths-S{seq_len}.npy"
    if saved.is_file():
        return np.load(saved)
    dst = cache / f"t0-prompt-completion-S{seq_len}"
    cmd = [sys.executable, "-m", "etl", "run", str(shared / T0_FILE), str(dst), "--quiet",
           "--tokenizer", str(shared / QWEN), "--template", "chatml", "--seq-len", str(seq_len),
           "--input-type", "prompt_completion", "--no-default-system"]
    subprocess.run(cmd, check=True)
    lengths = pq.read_table(dst / DATA_DIR, columns=[NUM_TOKENS])[NUM_TOKENS].to_numpy()
    cache.mkdir(parents=True, exist_ok=True)
    np.save(saved, lengths.astype(np.int64))
    return np.load(saved)


def best_of(repeats: int, fn: Callable[[], Any]) -> tuple[tuple[float, float], Any]:
    """Fastest (wall, CPU) seconds of ``repeats`` calls, and the last result.

    CPU seconds (this process) are shown too: on a shared machine the wall clock also counts
    time spent waiting for a core, CPU time much less so.
    """
    wall, cpu, out = float("inf"), float("inf"), None
    for _ in range(repeats):
        started, cpu_started = time.perf_counter(), time.process_time()
        out = fn()
        wall = min(wall, time.perf_counter() - started)
        cpu = min(cpu, time.process_time() - cpu_started)
    return (wall, cpu), out


def row(label: str, lengths: np.ndarray, seq_len: int, seconds: tuple[float, float], packs: int) -> list[str]:
    """One table row: label, N, wall and CPU seconds, packs, utilization, % over ceil(sum / S)."""
    tokens = int(np.minimum(lengths, seq_len).sum())
    bound = -(-tokens // seq_len)
    return [label, f"{len(lengths):,}", f"{seconds[0]:.3f}", f"{seconds[1]:.3f}", f"{packs:,}",
            f"{tokens / (packs * seq_len):.4f}", f"{100 * (packs / bound - 1):.3f}"]


def packer_section(lengths: np.ndarray, seq_len: int, repeats: int) -> list[list[str]]:
    """Every strategy of `STRATEGIES` on ``lengths``."""
    rows = []
    for label, strategy, options in STRATEGIES:
        seconds, packing = best_of(repeats, partial(pack, strategy, lengths, seq_len=seq_len, **options))
        rows.append(row(label, lengths, seq_len, seconds, packing.num_packs))
    return rows


def trl_section(lengths: np.ndarray, seq_len: int, repeats: int) -> list[list[str]]:
    """TRL's `pack_dataset(bfd)` on the same lengths (zero ids), global and in 1,000-row windows."""
    try:
        import pyarrow as pa
        from datasets import Dataset, disable_progress_bars
        from trl.data_utils import pack_dataset
    except ImportError:
        return []
    disable_progress_bars()  # a bar per map call would bury the tables
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.zeros(offsets[-1], dtype=np.int32)))
    data = Dataset(pa.table({"input_ids": ids}))
    rows = []
    for label, kwargs in (("TRL bfd (global)", {"batch_size": None}), ("TRL bfd 1000-row windows", {})):
        seconds, packed = best_of(repeats, partial(pack_dataset, data, seq_len, strategy="bfd", map_kwargs=kwargs))
        rows.append(row(label, lengths, seq_len, seconds, len(packed)))
    return rows


# (label, ParquetLoader options): the loader rows, padded first (the ratios' denominator).
LOADER_CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("padded (collate=fixed)", {}),
    ("packed bfd, etl pack index", {"packing": "bfd"}),
    ("packed bfd online per epoch (max_docs_per_bin=64)", {"packing": PackOptions("bfd", max_docs_per_bin=64)}),
]


def loader_rows(dst: Path, batches: int) -> list[tuple[str, int, float, int, int]]:
    """(label, batches, seconds, tokens delivered, real tokens) of `ParquetLoader` (B=32, T=2048,
    one process) for each of `LOADER_CONFIGS`; writes a bfd pack index into ``dst`` first."""
    from loader_throughput import T, measure  # bench/ is sys.path[0] when run as a script

    from etl.packing.index import build_pack_index
    from etl.packing.index_io import write_pack_index

    write_pack_index(dst, {"train": build_pack_index(dst, "train", strategy="bfd", seq_len=T + 1)})
    rows = []
    for label, kwargs in LOADER_CONFIGS:
        with warnings.catch_warnings():  # "packing online": what the last row asks for
            warnings.simplefilter("ignore", EtlWarning)
            n, seconds, shape, real, _ = measure(dst, batches, num_workers=0, **kwargs)
        rows.append((label, n, seconds, shape, real))
    return rows


def loader_section(dst: Path, batches: int) -> list[str]:
    """Real tokens/s of `ParquetLoader` batches (B=32, T=2048, one process) padded vs packed."""
    from loader_throughput import B, T

    lines = [f"| loader, B={B} T={T}, workers=0 | batches | s | real tokens/s | fill |", "|---|---:|---:|---:|---:|"]
    for label, n, seconds, shape, real in loader_rows(dst, batches):
        lines.append(f"| {label} | {n} | {seconds:.2f} | {real / seconds / 1e6:.1f}M | {real / shape:.3f} |")
    return lines


def print_table(title: str, rows: list[list[str]]) -> None:
    """A markdown table of `row`s under a title line."""
    head = ["strategy", "N", "wall s", "CPU s", "packs", "utilization", "over bound %"]
    print(f"\n{title}\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000], help="lengths drawn per table")
    p.add_argument("--seq-len", type=int, default=2048, help="S, tokens per pack (and etl run's --seq-len)")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per row; the fastest is shown")
    p.add_argument("--seed", type=int, default=0, help="seed of the draw with replacement")
    p.add_argument("--no-trl", action="store_true", help="skip TRL even when it is importable")
    p.add_argument("--loader-batches", type=int, default=300, help="batches timed per loader row (0: skip)")
    p.add_argument("--shared", type=Path, default=SHARED, help="the shared data folder (T0, Qwen2.5)")
    p.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "etl-bench")
    args = p.parse_args()
    if not (args.shared / T0_FILE).is_file() or not (args.shared / QWEN).is_dir():
        print(f"T0 or Qwen2.5 not found under {args.shared}; pass --shared DIR", file=sys.stderr)
        return 1
    t0 = t0_lengths(args.shared, args.cache, args.seq_len)
    print(f"T0 via etl run: {len(t0):,} rows, mean {t0.mean():.1f} tokens, S={args.seq_len}")
    rng = np.random.default_rng(args.seed)
    for n in args.sizes:
        lengths = rng.choice(t0, size=n, replace=True)
        rows = packer_section(lengths, args.seq_len, args.repeats)
        if n <= 100_000 and not args.no_trl:
            rows += trl_section(lengths, args.seq_len, args.repeats)
        print_table(f"N={n:,} lengths drawn from T0", rows)
    first = t0[:20_000]
    rows = packer_section(first, args.seq_len, args.repeats)
    rows += [] if args.no_trl else trl_section(first, args.seq_len, args.repeats)
    print_table("The first 20,000 T0 chats", rows)
    print(f"\n{TRL_ISSUE}")
    if args.loader_batches:
        print("\n" + "\n".join(loader_section(args.cache / f"t0-prompt-completion-S{args.seq_len}", args.loader_batches)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
