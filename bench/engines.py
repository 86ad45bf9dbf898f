"""Benchmark: `etl run` on T0 with the local engine and with `--engine ray` on the same machine.

The issue's bar: on one machine the Ray engine reaches at least 0.8x the local engine's tokens/s
(whole process, Ray's start-up included), so adding nodes is a gain from the first one. Rounds
are interleaved (local, ray, local, ray, ...) and the median per engine reported, since a shared
2-core machine drifts between runs. `results()` is what bench/results.py imports.

    python bench/engines.py [--rounds N] [--max-items N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
T0 = SHARED / "t0-train-50k" / "t0_train_50k_per_template.jsonl.gz"
QWEN = SHARED / "qwen2.5-tokenizer"
# "ray" starts and stops its own local Ray for the run (as `--engine ray` alone does: ~5 s of
# import, start and shutdown on 2 cores); "ray-cluster" joins one started before the rounds with
# `ray start --head`, as a job on a running cluster does.
ENGINES = ("local", "ray", "ray-cluster")
GOAL = 0.8  # issue 12: ray's tokens/s at least this fraction of local's on one machine
PORT = 6391  # the bench cluster's GCS port (not Ray's default 6379, to leave a user's cluster alone)


def command(engine: str, dst: Path, *, max_items: int | None = None) -> list[str]:
    """The `etl run` command line of one engine on T0 (what a user types, less the venv path)."""
    cmd = ["etl", "run", str(T0), str(dst), "--input-type", "prompt_completion", "--tokenizer", str(QWEN),
           "--template", "chatml", "--quiet", "--engine", engine.split("-")[0]]
    if engine == "ray-cluster":
        cmd += ["--ray-address", f"127.0.0.1:{PORT}"]
    if max_items is not None:
        config = dst.parent / "max_items.json"
        config.write_text(json.dumps({"preprocessing": {"max_items": max_items}}))
        cmd += ["--config", str(config)]
    return cmd


def _once(engine: str, work: Path, *, max_items: int | None) -> tuple[float, int]:
    """Wall seconds of one whole `etl run` process, and the tokens it wrote."""
    dst = work / f"{engine}-out"
    cmd = command(engine, dst, max_items=max_items)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": _home(engine, work)}  # Ray writes ~/.ray
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "etl", *cmd[1:]], check=False, env=env, cwd=work,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        tail = " | ".join(line for line in done.stderr.splitlines()[-5:] if line.strip())
        raise RuntimeError(f"{' '.join(cmd[:2])} --engine {engine} exited {done.returncode}: {tail}")
    seconds = time.perf_counter() - started
    tokens = json.loads((dst / "_manifest.json").read_text())["counts"]["tokens"]
    return seconds, tokens


def _home(engine: str, work: Path) -> str:
    """HOME for Ray: the bench cluster's own, since a run that starts its own Ray rewrites
    ~/.ray/auth_token, which the cluster's token must match."""
    home = work / ("cluster-home" if engine == "ray-cluster" else "home")
    home.mkdir(exist_ok=True)
    return str(home)


def _cluster(work: Path, *, start: bool) -> None:
    """Start (or stop) the bench's own Ray cluster: 2 CPUs, no dashboard, HOME in `work`."""
    ray = [str(Path(sys.executable).with_name("ray"))]
    args = ["start", "--head", f"--port={PORT}", "--num-cpus=2", "--include-dashboard=false",
            f"--temp-dir={work / 'ray'}"] if start else ["stop"]
    subprocess.run(ray + args, check=start, env={**os.environ, "HOME": _home("ray-cluster", work)},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _interleaved(engines: tuple[str, ...], work: Path, rounds: int, max_items: int | None) -> tuple[dict, int]:
    times: dict[str, list[float]] = {e: [] for e in engines}
    tokens = 0
    for _ in range(rounds):  # interleaved: local, ray, local, ray, ...
        for engine in engines:
            seconds, tokens = _once(engine, work, max_items=max_items)
            times[engine].append(seconds)
    return {e: statistics.median(t) for e, t in times.items()}, tokens


def results(rounds: int = 3, *, max_items: int | None = None) -> list[dict[str, Any]]:
    """One row per engine: {name, seconds (median), tokens/s, local s beside it, ray/local, command};
    [] without ../shared. The cluster rounds have their own local runs: its idle daemons use CPU."""
    if not T0.exists() or not QWEN.exists():
        return []
    with tempfile.TemporaryDirectory(prefix="etl-engines-") as tmp:
        work = Path(tmp)
        alone, tokens = _interleaved(ENGINES[:2], work, rounds, max_items)
        _cluster(work, start=True)
        try:
            beside, _ = _interleaved((ENGINES[0], ENGINES[2]), work, rounds, max_items)
        finally:
            _cluster(work, start=False)
    rows = []
    for engine, local in (("local", alone["local"]), ("ray", alone["local"]), ("ray-cluster", beside["local"])):
        seconds = alone[engine] if engine in alone else beside[engine]
        rows.append({"name": f"etl run --engine {engine} (T0, Qwen2.5, chatml)", "seconds": round(seconds, 2),
                     "tokens/s": f"{tokens / seconds / 1e6:.2f}M", "local seconds": round(local, 2),
                     "vs local": round(local / seconds, 2),
                     "goal ≥ 0.8x": "-" if engine == "local" else ("met" if local / seconds >= GOAL else "not met"),
                     "command": " ".join(command(engine, Path("DST"), max_items=max_items))})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-items", type=int, default=None, help="records of T0 (default all 50k)")
    args = p.parse_args()
    rows = results(args.rounds, max_items=args.max_items)
    if not rows:
        sys.exit(f"{T0} or {QWEN} missing")
    for row in rows:
        print(f"{row['name']}: {row['seconds']:.2f} s, {row['tokens/s']} tok/s, "
              f"{row['vs local']:.2f}x local's tokens/s (local {row['local seconds']:.2f} s)  ({row['command']})")


if __name__ == "__main__":
    main()
