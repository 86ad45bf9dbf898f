"""Ray at scale on one machine: `etl run` on T0 x10 (bench/scale.py's data) with the local engine,
with `--engine ray` starting its own Ray, and as a job on a running cluster of 1 and of 2 CPUs
(`ray start --head --num-cpus N`): what Ray costs against local, and what a second worker CPU
gives (docs/ray.md turns these into what a bigger node or cluster should give).

Qwen2.5, chatml, S = 8192, `--no-cache`; whole processes (wall), rounds interleaved, medians; the
sha256 of each run's data + turns parts (byte-identical across engines: the same chunks, the
same files).

    python bench/ray_scale.py [--factor 10] [--rounds 1]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from engines import PORT
from etl_throughput import QWEN
from scale import SEQ_LEN, cli, on_scaled, parts_digest

RUNS = ("local", "ray", "cluster-1", "cluster-2")  # cluster-N: a job on `ray start --num-cpus N`


def _etl(src: Path, dst: Path, run: str, home: Path) -> float:
    engine = [] if run == "local" else ["--engine", "ray"]
    address = ["--ray-address", f"127.0.0.1:{PORT}"] if run.startswith("cluster") else []
    cmd = [sys.executable, "-m", "etl", "run", str(src), str(dst), "--tokenizer", str(QWEN), "--template", "chatml",
           "--seq-len", str(SEQ_LEN), "--quiet", "--no-cache", *engine, *address]
    env = {**os.environ, "HOME": str(home)}  # Ray writes ~/.ray (its auth token) there
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{run}: exited {done.returncode}: {done.stderr[-500:]}")
    return time.perf_counter() - started


def _cluster(home: Path, cpus: int | None) -> None:
    """Start a head node of `cpus` CPUs (None: stop it)."""
    ray = str(Path(sys.executable).with_name("ray"))
    args = ["stop"] if cpus is None else ["start", "--head", f"--port={PORT}", f"--num-cpus={cpus}",
                                          "--include-dashboard=false", f"--temp-dir={home.parent / f'r{cpus}'}"]
    subprocess.run([ray, *args], env={**os.environ, "HOME": str(home)}, check=cpus is not None,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(src: Path, work: Path, rounds: int) -> list[str]:
    times: dict[str, list[float]] = {run: [] for run in RUNS}
    digests: dict[str, str] = {}
    for _ in range(rounds):
        for run in RUNS:
            home = work / f"home-{run}"
            home.mkdir(exist_ok=True)
            cpus = int(run.split("-")[1]) if run.startswith("cluster") else None
            if cpus:
                _cluster(home, cpus)
            try:
                dst = work / f"out-{run}"
                times[run].append(_etl(src, dst, run, home))
                digests[run] = parts_digest(dst)
            finally:
                if cpus:
                    _cluster(home, None)
    wall = {run: statistics.median(t) for run, t in times.items()}
    lines = [f"{src.stat().st_size / 1e6:,.0f} MB of chat JSONL; {rounds} round(s), interleaved, medians:", "",
             "| run | wall s | vs local |", "|---|---:|---:|"]
    for run in RUNS:
        lines.append(f"| {run} | {wall[run]:.1f} | {wall['local'] / wall[run]:.2f}x |")
    same = len(set(digests.values())) == 1
    lines += ["", (f"cluster-2 / cluster-1 speed-up: {wall['cluster-1'] / wall['cluster-2']:.2f}x; data + turns "
                   f"parts {'byte-identical across the four runs' if same else 'DIFFER: ' + repr(digests)}.")]
    return lines


def results(factor: int = 10, rounds: int = 1) -> str:
    """The section as markdown (bench/results.py's `optional_table`); empty without ../shared."""
    return on_scaled(measure, factor, rounds, "etl-ray-scale-")


def main() -> int:
    return cli(results, __doc__ or "", rounds=1)


if __name__ == "__main__":
    raise SystemExit(main())
