"""Speed at scale: `etl run` cold on T0 x10 against the machine's bare parse + encode bound.

The data (built here, not committed): all 55,185 T0 chats (as bench/etl_throughput.py writes them)
ten times over, each copy's every message prefixed `(k) `, so every text is distinct: ~650 MB of
JSONL. Qwen2.5, chatml, S = 8192, `--no-cache`.

The bound (`bare`, run as a child like etl, imports and tokenizer load included): Polars'
`read_ndjson` of the file, then gigatoken's own `encode_batch` of every message content, 8,192
texts a call; what any tool that reads this file and tokenizes it must at least do here.

Each round runs both, in turn; figures are whole processes (wall, CPU, peak RSS). The sha256 of
etl's `data` and `turns` parts is printed, so a later run shows whether the output stayed the same.

    python bench/scale.py [--factor 10] [--rounds 2]      # prints the table
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from child import Run, run_child
from etl_throughput import QWEN, T0, write_chats
from results_etl import REPO, child_env

MARKER = "<|endoftext|>"
SEQ_LEN = 8192
GOAL_RATIO, GOAL_PEAK_MIB = 1.5, 1024.0


def write_scaled(out: Path, factor: int, tmp: Path) -> Path:
    """All T0 chats `factor` times, copy k's message texts prefixed `(k) `."""
    base = tmp / "t0-all.jsonl"
    write_chats(None, base, strip_suffix=MARKER)
    records = [json.loads(line) for line in base.read_text(encoding="utf-8").split("\n") if line]
    with out.open("w", encoding="utf-8") as f:
        for k in range(factor):
            for record in records:
                messages = [{**m, "content": f"({k}) {m['content']}"} for m in record["messages"]]
                f.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
    return out


def bare(src: Path) -> None:
    """The bound, in this process: read, list the contents, load gigatoken, encode them all."""
    started = time.perf_counter()
    import awkward as ak
    import gigatoken
    import polars as pl

    frame = pl.read_ndjson(src)
    parsed = time.perf_counter()
    contents = frame.select(pl.col("messages").list.explode().struct.field("content")).to_series().to_list()
    tok = gigatoken.Tokenizer(str(QWEN))
    loaded = time.perf_counter()
    tokens = sum(int(ak.sum(ak.num(tok.encode_batch(contents[i:i + 8192])))) for i in range(0, len(contents), 8192))
    done = time.perf_counter()
    print(json.dumps({"parse": parsed - started, "load": loaded - parsed, "encode": done - loaded, "tokens": tokens,
                      "texts": len(contents)}))


def etl_cmd(src: Path, dst: Path) -> list[str]:
    return [sys.executable, "-m", "etl", "run", str(src), str(dst), "--tokenizer", str(QWEN), "--template", "chatml",
            "--seq-len", str(SEQ_LEN), "--quiet", "--no-cache", "--timings"]


def parts_digest(dst: Path) -> str:
    """sha256 over the `data` and `turns` parts' bytes, in path order."""
    digest = hashlib.sha256()
    for part in sorted(p for folder in ("data", "turns") for p in (dst / folder).rglob("*.parquet")):
        digest.update(part.relative_to(dst).as_posix().encode())
        digest.update(part.read_bytes())
    return digest.hexdigest()


def _timings(run: Run) -> str:
    return next((line for line in run.output.splitlines() if line.startswith("etl run timings")), "")


def measure(src: Path, tmp: Path, rounds: int) -> list[str]:
    runs: dict[str, list[Run]] = {"etl": [], "bound": []}
    digests = set()
    for r in range(rounds):
        for name in (("etl", "bound") if r % 2 == 0 else ("bound", "etl")):
            if name == "bound":
                runs[name].append(run_child([sys.executable, __file__, "bare", str(src)], env=child_env(), cwd=str(REPO)))
                continue
            dst = tmp / f"etl{r}"
            runs[name].append(run_child(etl_cmd(src, dst), env=child_env(), cwd=str(REPO)))
            digests.add(parts_digest(dst))
    wall = {name: statistics.median(run.wall for run in done) for name, done in runs.items()}
    peak = max(run.peak_mib for run in runs["etl"])
    parts = json.loads(runs["bound"][0].output.strip().splitlines()[-1])
    ratio = wall["etl"] / wall["bound"]
    lines = [(f"{src.stat().st_size / 1e6:,.0f} MB, {parts['texts']:,} texts, {parts['tokens']:,} content tokens; "
             f"{rounds} round(s), interleaved, whole processes (medians):"), "",
             "| job | wall s | CPU s | peak RSS MiB |", "|---|---:|---:|---:|"]
    for name, label in (("etl", "etl run, cold (`--no-cache`)"), ("bound", "bare bound: read_ndjson + gigatoken")):
        done = runs[name]
        lines.append(f"| {label} | {wall[name]:.1f} | {statistics.median(run.cpu for run in done):.1f} | "
                     f"{max(run.peak_mib for run in done):,.0f} |")
    lines += ["", (f"Bound's parts (first round): parse {parts['parse']:.1f} s, load {parts['load']:.1f} s, "
              f"encode {parts['encode']:.1f} s."),
              (f"etl / bound: **{ratio:.2f}x** (goal <= {GOAL_RATIO}x: {'met' if ratio <= GOAL_RATIO else 'not met'}); "
              f"etl's peak RSS {peak:,.0f} MiB (goal <= {GOAL_PEAK_MIB:,.0f}: "
              f"{'met' if peak <= GOAL_PEAK_MIB else 'not met'})."),
              "etl's `--timings` (first round): `" + _timings(runs["etl"][0]) + "`",
              f"etl's data + turns parts, sha256: {', '.join(sorted(digests))}"
              + (" (the same every round)" if len(digests) == 1 else " (rounds DIFFER)")]
    return lines


def on_scaled(measure_fn: Callable[[Path, Path, int], list[str]], factor: int, rounds: int, prefix: str) -> str:
    """`measure_fn(src, tmp, rounds)`'s lines, as markdown, on T0 x`factor` written in a temporary
    folder; empty without ../shared. bench/ray_scale.py measures on the same data."""
    if not T0.is_file() or not QWEN.is_dir():
        return ""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        src = write_scaled(Path(tmp) / f"t0-x{factor}.jsonl", factor, Path(tmp))
        return "\n".join(measure_fn(src, Path(tmp), rounds))


def cli(results_fn: Callable[[int, int], str], doc: str, rounds: int) -> int:
    """The command line of a T0 x`factor` bench: --factor, --rounds, then the table."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--factor", type=int, default=10, help="copies of all of T0")
    p.add_argument("--rounds", type=int, default=rounds, help="interleaved rounds")
    args = p.parse_args()
    text = results_fn(args.factor, args.rounds)
    if not text:
        print(f"benchmark data not found ({T0}); it lives in ../shared/data", file=sys.stderr)
        return 1
    print(text)
    return 0


def results(factor: int = 10, rounds: int = 2) -> str:
    """The section as markdown (bench/results.py's `optional_table`); empty without ../shared."""
    return on_scaled(measure, factor, rounds, "etl-scale-")


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "bare":
        bare(Path(sys.argv[2]))
        return 0
    return cli(results, __doc__ or "", rounds=2)


if __name__ == "__main__":
    raise SystemExit(main())
