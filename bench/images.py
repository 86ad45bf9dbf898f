"""Image conversations: `etl run` against a `datasets.map` that does what LLaMA-Factory's
preprocessing does, and etl's peak RSS as the input grows.

The data (built here, not committed): N conversations in LLaMA-Factory's layout (`messages` with
`<image>` placeholders, `images` paths), 1-3 images each over two user turns, drawn from the 29
readable images of ../shared/data/images (scikit-image's and LLaMA-Factory's demo JPEGs; the same
files repeat, so they are read from the page cache after the first round). Qwen2.5-VL's processor
folder, its chat template; `max_pixels` 768 x 768 (LLaMA-Factory's `image_max_pixels` default);
S = 4096 so that no conversation is cut.

The peer (`vl_map`, run as a child): `load_dataset("json")` + `Dataset.map(batched=True,
num_proc=2)`, per example: open each image (`load_image`), run the image processor (its
`pixel_values` computed and dropped, as LLaMA-Factory's `_get_mm_inputs` does while tokenizing),
expand each `<image>` to `<|vision_start|>` + grid / 4 x `<|image_pad|>` + `<|vision_end|>`,
render the chat template, tokenize with offsets, train the assistant turns; written as Parquet.

    python bench/images.py [--rows 5000] [--rounds 1]       # prints the tables
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from child import Run, run_child
from peers import char_spans

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
FOLDER = SHARED / "qwen2.5-vl-processor"
IMAGES = [SHARED / "images" / "scikit-image", SHARED / "images" / "llamafactory-mllm-demo" / "mllm_demo_data"]
MAX_PIXELS = 768 * 768
SEQ_LEN = 4096
PAD, START, END = "<|image_pad|>", "<|vision_start|>", "<|vision_end|>"


def image_files() -> list[str]:
    files = [p for folder in IMAGES for p in sorted(folder.iterdir())]
    return [str(p) for p in files if p.suffix in (".png", ".jpg", ".gif", ".tif") and p.name != "multipage_rgb.tif"]


def write_conversations(n: int, path: Path, seed: int = 0) -> Path:
    """N LLaMA-Factory conversations (placeholders + absolute image paths) as JSONL."""
    rng, files = random.Random(seed), image_files()
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            k = rng.randint(1, 3)
            f.write(json.dumps({"messages": [
                {"role": "user", "content": "<image>" * (k - 1) + f"Describe picture set {i}."},
                {"role": "assistant", "content": f"It shows item {i}: " + "a scene with details. " * rng.randint(1, 8)},
                {"role": "user", "content": "And this one?<image>"},
                {"role": "assistant", "content": f"Another view, number {i}."}], "images": rng.sample(files, k)}) + "\n")
    return path


def vl_batch(batch: dict[str, list[Any]], tok: Any, proc: Any) -> dict[str, list[Any]]:
    """One `Dataset.map` batch, as LLaMA-Factory's Qwen2-VL plugin prepares it."""
    from transformers.image_utils import load_image

    ids, masks = [], []
    for messages, files in zip(batch["messages"], batch["images"], strict=True):
        grids = proc(images=[load_image(f) for f in files], return_tensors="np")["image_grid_thw"]
        counts = iter(int(g.prod()) // proc.merge_size ** 2 for g in grids)
        msgs = [{"role": m["role"], "content": _expand(m["content"], counts)} for m in messages]
        text = tok.apply_chat_template(msgs, tokenize=False)
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        starts = np.fromiter((s for s, _ in enc["offset_mapping"]), np.int64)
        ends = np.fromiter((e for _, e in enc["offset_mapping"]), np.int64)
        mask = np.zeros(len(starts), np.int8)
        for lo, hi in char_spans(tok, msgs):
            mask[(starts >= lo) & (ends <= hi)] = 1
        ids.append(enc["input_ids"])
        masks.append(mask.tolist())
    return {"input_ids": ids, "assistant_masks": masks}


def _expand(content: str, counts: Any) -> str:
    pieces = content.split("<image>")
    return pieces[0] + "".join(START + PAD * next(counts) + END + p for p in pieces[1:])


def vl_map(src: Path, dst: Path, num_proc: int) -> None:
    """The peer: datasets' batched map over the JSONL with `num_proc` processes, a fresh cache."""
    from datasets import disable_progress_bars, load_dataset
    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

    disable_progress_bars()
    tok = AutoTokenizer.from_pretrained(str(FOLDER))
    proc = Qwen2VLImageProcessorPil.from_pretrained(str(FOLDER), max_pixels=MAX_PIXELS)
    with tempfile.TemporaryDirectory() as cache:
        data = load_dataset("json", data_files=str(src), split="train", cache_dir=cache)
        out = data.map(vl_batch, fn_kwargs={"tok": tok, "proc": proc}, batched=True, batch_size=64,
                       num_proc=num_proc, remove_columns=data.column_names, load_from_cache_file=False)
        out.to_parquet(str(dst))


def etl_cmd(src: Path, dst: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "etl", "run", str(src), str(dst), "--tokenizer", str(FOLDER), "--no-cache",
            "--max-pixels", str(MAX_PIXELS), "--seq-len", str(SEQ_LEN), "--quiet", "--timings", *extra]


def agreement(etl_dst: Path, peer: Path) -> str:
    """One line: etl's ids and masks against the peer's, row by row."""
    ours = pq.read_table(etl_dst / "data", columns=["source_line", "input_ids", "loss_mask"]).sort_by("source_line")
    theirs = pq.read_table(peer)
    ids, masks = theirs["input_ids"].to_pylist(), theirs["assistant_masks"].to_pylist()
    same = sum(ids[line] == i and [bool(x) for x in masks[line]] == m for line, i, m in
               zip(*(ours[k].to_pylist() for k in ("source_line", "input_ids", "loss_mask")), strict=True))
    return f"etl's rows against the peer's: {same:,} of {ours.num_rows:,} equal (input_ids and assistant mask)."


def speed(tmp: Path, rows: int, rounds: int) -> tuple[list[str], Path, Path]:
    """The timed runs, interleaved; returns (markdown lines, etl's DST, the peer's Parquet)."""
    src = write_conversations(rows, tmp / "images.jsonl")
    jobs = {"etl run (`--images embed`, the default)": lambda r: etl_cmd(src, tmp / f"embed{r}"),
            "etl run `--images reference`": lambda r: etl_cmd(src, tmp / f"ref{r}", "--images", "reference"),
            "datasets.map, num_proc=2 (LLaMA-Factory's work)": lambda r: [
                sys.executable, __file__, "peer", str(src), str(tmp / f"peer{r}.parquet")]}
    runs: dict[str, list[Run]] = {name: [] for name in jobs}
    for r in range(rounds):
        for name, cmd in list(jobs.items())[r % 3:] + list(jobs.items())[:r % 3]:
            runs[name].append(run_child(cmd(r)))
    peer_wall = float(np.median([run.wall for run in runs[list(jobs)[2]]]))
    lines = [f"{rows:,} conversations ({_images(src):,} images), {rounds} round(s), whole process, cold (`--no-cache`):",
             "", "| job | wall s (median) | CPU s | peak RSS MiB | vs the peer |", "|---|---:|---:|---:|---:|"]
    for name, done in runs.items():
        wall = float(np.median([run.wall for run in done]))
        lines.append(f"| {name} | {wall:.1f} | {np.median([run.cpu for run in done]):.1f} | "
                     f"{max(run.peak_mib for run in done):,.0f} | {peer_wall / wall:.1f}x |")
    lines += ["", "Goal: etl >= 20x the peer cold. " + agreement(tmp / "embed0", tmp / "peer0.parquet"), "",
              "etl's `--timings` (embed, round 1): `" + next(line for line in runs[next(iter(jobs))][0].output.splitlines()
                                                             if line.startswith("etl run timings")) + "`"]
    return lines, tmp / "embed0", tmp / "peer0.parquet"


def _images(src: Path) -> int:
    with src.open(encoding="utf-8") as f:
        return sum(len(json.loads(line)["images"]) for line in f)


def memory(tmp: Path, sizes: tuple[int, int]) -> list[str]:
    """Peak RSS of `etl run` (embed) on the two sizes: the ETL holds no pixels, and a bounded slice of files."""
    peaks = {}
    for n in sizes:
        src = write_conversations(n, tmp / f"mem{n}.jsonl", seed=1)
        # One backend for both: `auto` picks gigatoken above 4 MiB of input, whose encoder adds its
        # own fixed ~100 MiB to the larger run only.
        peaks[n] = run_child(etl_cmd(src, tmp / f"mem{n}", "--tokenizer-backend", "hf")).peak_mib
    small, big = sizes
    return ["Both with `--tokenizer-backend hf` (auto picks gigatoken for the larger input only).", "",
            "| conversations | peak RSS MiB |", "|---:|---:|", *(f"| {n:,} | {p:,.0f} |" for n, p in peaks.items()), "",
            f"Peak RSS at {big:,} is {peaks[big] / peaks[small]:.2f}x that at {small:,} (goal <= 1.2x)."]


def loader(dst: Path, batches: int = 20) -> list[str]:
    """The loader's images/s over etl's output: pixel values decoded and resized in its workers."""
    from etl.loader import PackOptions, ParquetLoader

    lines = ["| batches | workers | images | seconds | images/s |", "|---|---:|---:|---:|---:|"]
    for workers in (0, 2):
        loader = ParquetLoader(dst, batch_size=8, packing=PackOptions("bfd"), seed=0, num_workers=workers)
        started, images = time.perf_counter(), 0
        for k, batch in enumerate(loader):
            images += len(batch["image_grid_thw"])
            if k + 1 == batches:
                break
        seconds = time.perf_counter() - started  # workers' start included
        lines.append(f"| packed bfd, 8 rows | {workers} | {images:,} | {seconds:.1f} | {images / seconds:,.0f} |")
    return lines


def results(rows: int = 5000, rounds: int = 1, sizes: tuple[int, int] = (2000, 20000)) -> str:
    """Both tables as markdown (bench/results.py's `optional_table`); empty without ../shared."""
    if not FOLDER.is_dir():
        return ""
    with tempfile.TemporaryDirectory(prefix="etl-images-") as tmp:
        lines, dst, _ = speed(Path(tmp), rows, rounds)
        rates = loader(dst)
        mem = memory(Path(tmp), sizes)
    return "\n".join([*lines, "", "Loader over etl's output (`ParquetLoader`, packed bfd, S = 4096):", "", *rates, "",
                      "Memory (`--images embed`):", "", *mem])


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "peer":
        vl_map(Path(sys.argv[2]), Path(sys.argv[3]), num_proc=2)
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=5000, help="conversations in the timed runs")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds of the timed jobs")
    p.add_argument("--sizes", type=int, nargs=2, default=(2000, 20000), help="conversations of the two memory runs")
    args = p.parse_args()
    text = results(args.rows, args.rounds, tuple(args.sizes))
    if not text:
        print(f"benchmark data not found ({FOLDER}); it lives in ../shared/data", file=sys.stderr)
        return 1
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
