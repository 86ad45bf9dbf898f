"""Sections of results.md on how `etl run` scales: 1 vs 2 cores, local vs ray engine, and peak
memory as the input grows (a T0 slice repeated). Each `etl run` is a child measured alone.
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
import statistics
from pathlib import Path
from typing import Any

from child import Run, run_child
from results_etl import REPO, Data, backend_of, child_env, etl_cmd, rounds_of
from results_md import Table, from_results, rate, ratio, secs

ONE_CORE = (["taskset", "-c", "0"], {"RAYON_NUM_THREADS": "1", "POLARS_MAX_THREADS": "1"})
TWO_CORES: tuple[list[str], dict[str, str]] = (["taskset", "-c", "0,1"], {})
GIB = 1024.0  # MiB
# The memory runs: etl's default backend (no flag) and the hf backend; the difference is the default's share.
MEMORY_BACKENDS: dict[str, tuple[str, ...]] = {"default": (), "hf": ("--tokenizer-backend", "hf")}


def cores_table(data: Data, rounds: int) -> Table:
    """The same `etl run` pinned to core 0 (1 thread for rayon and polars) and to cores 0-1."""
    title = "1 core vs 2 cores (`etl run`, same chats as section 1)"
    if shutil.which("taskset") is None:
        return Table(title, [], notes=["`taskset` not found on this machine: not measured."])
    dst = data.tmp / "cores"
    setups = {"1 core": ONE_CORE, "2 cores": TWO_CORES}
    cmds = {name: [*prefix, *etl_cmd(data.chats, dst, data.tokenizer)] for name, (prefix, _) in setups.items()}
    cpu: dict[str, list[float]] = {name: [] for name in setups}

    def job(name: str) -> float:
        run = run_child(cmds[name], env=child_env(setups[name][1]), cwd=str(REPO))
        cpu[name].append(run.cpu)
        return run.wall

    times = rounds_of({name: (lambda n=name: job(n)) for name in setups}, rounds)
    tokens = json.loads((dst / "_manifest.json").read_text())["counts"]["tokens"]
    rows = [[name, data.show(cmds[name], setups[name][1]), secs(times[name]), f"{statistics.median(cpu[name]):.1f}",
             rate(tokens, statistics.median(times[name]))] for name in setups]
    speedup = statistics.median(times["1 core"]) / statistics.median(times["2 cores"])
    best = min(times["1 core"]) / min(times["2 cores"])
    notes = [(f"Speed-up from 1 to 2 cores (1-core seconds / 2-core seconds): **{ratio(speedup)}** on medians "
              f"({ratio(best)} on each setup's best round). Under 1 core "
             "`RAYON_NUM_THREADS=1` (the tokenizer's rayon pool) and `POLARS_MAX_THREADS=1` are set; DuckDB (the "
             "record builder) still starts its default threads, all on core 0. With 2 cores nothing is set. "
             "Other jobs on this shared machine may hold a core; the 2-core figure suffers most from that.")]
    return Table(title, ["cores", "command", "wall s, median (range)", "CPU s", "written tok/s"], rows, notes)


def optional_module(name: str) -> Any | None:
    """`bench/NAME.py` (or `bench.NAME`) when it exists and has `results()`, else None."""
    for module in (name, f"bench.{name}"):
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        if callable(getattr(found, "results", None)):
            return found
    return None


def optional_table(name: str, title: str) -> Table:
    """The table of `bench/NAME.py`'s `results()`, or a line saying it is not in this build."""
    module = optional_module(name)
    if module is None:
        return Table(title, [], notes=[f"Not available in this build (no `bench/{name}.py` with `results()`)."])
    try:
        rows = module.results()
        if not rows:
            missing = f"Not measured: `bench/{name}.py` found none of its data (it needs ../shared/data)."
            return Table(title, [], notes=[missing])
        table = from_results(title, rows)
    except Exception as exc:  # noqa: BLE001 - a failing optional bench must not lose the other tables
        return Table(title, [], notes=[f"`bench/{name}.py` `results()` failed: {type(exc).__name__}: {exc}"])
    table.notes.append(f"From `bench/{name}.py` `results()`.")
    return table


def engines(data: Data, rounds: int) -> Table:
    """`bench/engines.py`'s table when present; else local vs ray measured here when `etl run`
    offers `--engine ray`; else a line saying the ray engine is not in this build."""
    title = "local vs ray engine (`etl run --engine`, one machine)"
    if optional_module("engines") is not None:
        return optional_table("engines", title)
    usage = run_child(etl_cmd(data.chats, data.tmp / "x", data.tokenizer, "--help"), env=child_env(), cwd=str(REPO)).output
    choices = re.search(r"--engine \{([^}]*)\}", usage)
    if not choices or "ray" not in choices.group(1).split(","):
        offered = choices.group(1) if choices else "no --engine flag"
        return Table(title, [], notes=[f"ray engine not available in this build (`etl run --engine` offers: {offered}); not measured."])
    cmds = {e: etl_cmd(data.chats, data.tmp / f"engine-{e}", data.tokenizer, "--engine", e) for e in ("local", "ray")}
    times = rounds_of({e: (lambda e=e: run_child(cmds[e], env=child_env(), cwd=str(REPO)).wall) for e in cmds}, rounds)
    rows = [[e, data.show(cmds[e]), secs(times[e])] for e in cmds]
    ray_local = statistics.median(times["ray"]) / statistics.median(times["local"])
    return Table(title, ["engine", "command", "wall s, median (range)"], rows,
                 [f"ray seconds / local seconds: **{ratio(ray_local)}** (ray's start-up included, as a user pays it)."])


def repeated(slice_path: Path, factor: int, out: Path) -> Path:
    """The slice's JSONL written `factor` times over into one file."""
    text = slice_path.read_bytes()
    with out.open("wb") as f:
        for _ in range(factor):
            f.write(text)
    return out


def memory_table(data: Data, slice_path: Path, slice_rows: int, factors: tuple[int, int], rounds: int = 1) -> Table:
    """Peak RSS of `etl run` at default settings (so its default backend) and with
    `--tokenizer-backend hf` on the slice repeated `factors` times, in `rounds` interleaved rounds
    (medians: peaks move by ~50 MiB between runs). The difference is the default backend's share."""
    srcs = {f: repeated(slice_path, f, data.tmp / f"slice-x{f}.jsonl") for f in factors}
    data.names.update({str(src): f"$SLICE_X{f}" for f, src in srcs.items()})
    setups = {f"{f} {b}": (f, b) for f in factors for b in MEMORY_BACKENDS}
    dsts = {key: data.tmp / f"mem-x{f}-{b}" for key, (f, b) in setups.items()}
    cmds = {key: etl_cmd(srcs[f], dsts[key], data.tokenizer, *MEMORY_BACKENDS[b]) for key, (f, b) in setups.items()}
    runs: dict[str, list[Run]] = {key: [] for key in setups}

    def job(key: str) -> float:
        runs[key].append(run_child(cmds[key], env=child_env(), cwd=str(REPO)))
        return runs[key][-1].wall

    rounds_of({key: (lambda k=key: job(k)) for key in setups}, rounds)
    peaks = {setups[key]: statistics.median(r.peak_mib for r in rs) for key, rs in runs.items()}
    rows = []
    for key, (f, b) in setups.items():
        counts = json.loads((dsts[key] / "_manifest.json").read_text())["counts"]
        wall = statistics.median(r.wall for r in runs[key])
        share = f"{peaks[f, b] - peaks[f, 'hf']:+.0f}" if b == "default" else "-"
        rows.append([f"{f}×", f"{counts['read']:,}", f"{srcs[f].stat().st_size / 1e6:.0f}", backend_of(dsts[key]),
                     data.show(cmds[key]), secs([r.peak_mib for r in runs[key]], 0), share, f"{wall:.1f}",
                     rate(counts["tokens"], wall)])
    for src in srcs.values():
        src.unlink()
    notes = [(f"Input: the first {slice_rows:,} T0 chats written {factors[0]}× and {factors[1]}× over (`$SLICE_X…`), "
              f"each with the default backend and with `--tokenizer-backend hf`, {rounds} interleaved run(s) each, "
              "medians. Peak RSS is `etl run`'s own `ru_maxrss` (`os.wait4` in `bench/child.py`'s ~10 MiB launcher: a "
              "child of this benchmark process directly would report at least this process's size). Encoder: the "
              "manifest's `token_cache.backend`; last but two: the default run's peak minus the hf run's."),
             memory_verdict(peaks, factors)]
    columns = ["input", "chats", "MB", "encoder", "command", "peak RSS MiB, median (range)", "peak − hf peak MiB",
               "wall s", "written tok/s"]
    return Table(f"Peak memory as the input grows ({factors[0]}× and {factors[1]}× a T0 slice)", columns, rows, notes)


def memory_verdict(peaks: dict[tuple[int, str], float], factors: tuple[int, int]) -> str:
    """The growth of the default backend's median peak from the small to the large input, its share
    over the hf backend at each, and the acceptance (the large peak ≤ 1.2 × the small one, under 1 GiB)."""
    small, large = ((f, "default") for f in factors)
    growth = peaks[large] / peaks[small]
    top = max(peaks[small], peaks[large])
    verdict = "met" if growth <= 1.2 and top < GIB else "not met"
    shares = ", ".join(f"{peaks[f, 'default'] - peaks[f, 'hf']:+.0f} MiB at {f}×" for f in factors)
    return (f"Default backend: {factors[1]}× / {factors[0]}× median peak **{ratio(growth)}**, largest median {top:.0f} MiB "
            f"(hf backend: {ratio(peaks[factors[1], 'hf'] / peaks[factors[0], 'hf'])}); the default backend's share "
            f"(its peak minus the hf backend's): {shares}. Acceptance ({factors[1]}× ≤ 1.2 × the {factors[0]}× peak, and "
            f"under 1 GiB, default backend): **{verdict}**.")
