"""Loader throughput: tokens/s of (B=32, T=2048) batches delivered, next to a bare pyarrow read.

    python bench/loader_throughput.py [DST] [--batches 400] [--synthetic]

Without DST it builds T0-train-50k with Qwen2.5 + chatml through `etl run` (the T0 prompt /
completion pairs are rewritten as `messages` JSONL first), or synthetic Parquet of the same shape
when ../shared or `etl run` is unavailable; the output says which.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from etl.columns import (
    DATA_DIR,
    INPUT_IDS,
    LOSS_MASK,
    MANIFEST_FILE,
    MANIFEST_FORMAT_VERSION,
    NUM_TOKENS,
)
from etl.loader.dataloader import ParquetLoader
from etl.output.writer import OutputWriter

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"
T0 = SHARED / "t0-train-50k" / "t0_train_50k_per_template.jsonl.gz"
QWEN = SHARED / "qwen2.5-tokenizer"
B, T = 32, 2048


def build_t0(dst: Path) -> str:
    """T0 -> messages JSONL -> `etl run --tokenizer qwen2.5 --template chatml`."""
    src = dst.parent / "t0_messages.jsonl"
    with gzip.open(T0, "rt", encoding="utf-8") as f, open(src, "w", encoding="utf-8") as out:
        for line in f:
            rec = json.loads(line)
            answer = rec["completion"].removesuffix("<|endoftext|>")  # GPT-3 fine-tuning marker
            msgs = [
                {"role": "user", "content": rec["prompt"]},
                {"role": "assistant", "content": answer},
            ]
            out.write(json.dumps({"messages": msgs}) + "\n")
    etl = [sys.executable, "-m", "etl", "run", str(src), str(dst), "--quiet"]
    etl += ["--tokenizer", str(QWEN), "--template", "chatml", "--seq-len", str(T + 1)]
    subprocess.run(etl, check=True)
    return "T0-train-50k, Qwen2.5 + chatml, via `etl run`"


def build_synthetic(dst: Path, *, rows: int = 55_185, seed: int = 0) -> str:
    """Random ids with T0-like lengths (log-normal, median ~150, capped at 2049), 1024-row groups."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(150), 1.0, rows).astype(np.int64), 8, T + 1)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    ids = rng.integers(0, 151_643, int(offsets[-1]), dtype=np.int32)
    mask = np.arange(offsets[-1]) >= np.repeat(offsets[:-1] + lengths // 2, lengths)
    table = pa.table(
        {
            INPUT_IDS: pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)),
            LOSS_MASK: pa.ListArray.from_arrays(pa.array(offsets), pa.array(mask)),
            NUM_TOKENS: pa.array(lengths.astype(np.int32)),
        }
    )
    with OutputWriter(dst, kind="run") as output:  # listed in a manifest, as readers require
        part = output.reserve(dst / DATA_DIR / "train" / "part-00000.parquet")
        part.parent.mkdir(parents=True)
        pq.write_table(table, part, row_group_size=1024)
        output.add(part, rows=table.num_rows)
        output.commit({"format_version": MANIFEST_FORMAT_VERSION, "pad_id": 151643, "eot_id": 151645, "seq_len": T + 1})
    return "SYNTHETIC Parquet shaped like T0 (etl run or ../shared unavailable)"


def default_dst(cache: Path, synthetic: bool) -> tuple[Path, str]:
    dst = cache / ("synthetic" if synthetic else "t0-qwen2.5")
    manifest = dst / MANIFEST_FILE
    if manifest.is_file() and json.loads(manifest.read_text()).get("format_version") == MANIFEST_FORMAT_VERSION:
        return dst, f"cached {dst}"
    cache.mkdir(parents=True, exist_ok=True)
    if not synthetic and T0.is_file() and QWEN.is_dir():
        try:
            return dst, build_t0(dst)
        except subprocess.CalledProcessError as exc:
            print(f"etl run failed ({exc}); falling back to synthetic data", file=sys.stderr)
    return dst, build_synthetic(cache / "synthetic")


def bare_read(dst: Path) -> tuple[float, int]:
    """Median seconds of `pq.read_table` of ids + masks, and the tokens read."""
    times, tokens = [], 0
    pq.read_table(dst / DATA_DIR / "train", columns=[INPUT_IDS, LOSS_MASK])  # warm the page cache
    for _ in range(5):
        t0 = time.perf_counter()
        table = pq.read_table(dst / DATA_DIR / "train", columns=[INPUT_IDS, LOSS_MASK])
        times.append(time.perf_counter() - t0)
        tokens = sum(len(c.values) for c in table[INPUT_IDS].chunks)
    return statistics.median(times), tokens


def measure(dst: Path, batches: int, **kwargs: object) -> tuple[int, float, int, int, int]:
    """Batches, seconds, tokens delivered (B*T), real tokens, trained targets; after 1 warm-up."""
    loader = ParquetLoader(dst, batch_size=B, seq_len=T + 1, seed=0, **kwargs)  # type: ignore[arg-type]
    it = iter(loader)
    next(it)  # worker start-up and the first row-group reads are not throughput
    n = shape = real = trained = 0
    t0 = time.perf_counter()
    for batch in it:
        n += 1
        shape += batch["x"].numel()
        # numpy counts: torch's bool reductions on CPU cost ~10 ms here and would dominate.
        real += int(np.count_nonzero(batch["attention_mask"].numpy()))
        trained += int(np.count_nonzero(batch["loss_mask"].numpy()))
        if n == batches:
            break
    return n, time.perf_counter() - t0, shape, real, trained


def measure_episodes(dst: Path, batches: int) -> tuple[int, float, int, int, int]:
    """The episode loader over `etl export --format episodes` of the same data (memmapped)."""
    from etl.export.episode_loader import EpisodeDataLoader
    from etl.export.episodes import export_episodes
    from etl.export.training_xml import TrainingConfig

    out = dst.parent / f"{dst.name}-episodes"
    if not (out / "meta.json").is_file():
        export_episodes(dst, out, splits=("train",))
    cfg = TrainingConfig(dataset_mode="sft_episode", epoch_seed=0)
    loader = EpisodeDataLoader(out, cfg, batch_size=B, block_size=T)
    loader.get_batch("train")
    shape = real = 0
    t0 = time.perf_counter()
    for _ in range(batches):
        x = loader.get_batch("train")[0]
        shape += x.numel()
        # real tokens of the batch: from the episode lengths, as padding ids may occur in text
        real += int(
            np.minimum(loader.splits["train"].index[loader.last_episode_ids["train"], 1], T).sum()
        )
    return batches, time.perf_counter() - t0, shape, real, 0


CONFIGS = [
    ("workers=0 block shuffle (8 row groups)", {"num_workers": 0}),
    ("workers=2 block shuffle (8 row groups)", {"num_workers": 2}),
    ("workers=0 full shuffle", {"num_workers": 0, "shuffle_window": None}),
    ("workers=2 full shuffle", {"num_workers": 2, "shuffle_window": None}),
    ("workers=0 block, collate=longest", {"num_workers": 0, "collate": "longest"}),
    ("workers=0 packing=bfd (online per epoch)", {"num_workers": 0, "packing": "bfd"}),
    ("workers=2 packing=bfd (online per epoch)", {"num_workers": 2, "packing": "bfd"}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dst", nargs="?", type=Path, help="etl run output (default: build T0)")
    parser.add_argument("--batches", type=int, default=400, help="batches timed per config")
    parser.add_argument("--synthetic", action="store_true", help="force synthetic data")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "etl-bench")
    args = parser.parse_args()
    dst, origin = (
        (args.dst, f"given {args.dst}") if args.dst else default_dst(args.cache, args.synthetic)
    )
    seconds, tokens = bare_read(dst)
    print(f"data: {origin}\nB={B} T={T}, {os.cpu_count()} CPUs, torch threads {torch_threads()}")
    print(
        f"{'config':<40} {'batches':>7} {'s':>6} {'batch tok/s':>12} {'real tok/s':>11} {'fill':>5}"
    )
    print(
        f"{'bare pq.read_table (ids+mask)':<40} {'-':>7} {seconds:6.2f} {'-':>12} {tokens / seconds:11.3g} {'-':>5}"
    )
    for name, kwargs in CONFIGS:
        n, s, shape, real, _ = measure(dst, args.batches, **kwargs)
        print(f"{name:<40} {n:>7} {s:6.2f} {shape / s:12.3g} {real / s:11.3g} {real / shape:5.0%}")
    n, s, shape, real, _ = measure_episodes(dst, args.batches)
    name = "EpisodeDataLoader.get_batch (memmap)"
    print(f"{name:<40} {n:>7} {s:6.2f} {shape / s:12.3g} {real / s:11.3g} {real / shape:5.0%}")


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    main()
