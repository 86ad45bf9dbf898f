"""What the sections of results.md that run `etl run` as a user runs it (a child process each)
share: the data, the command, interleaved rounds; and the start-up section. The side-by-side with
the bare tokenizers and the peers is in results_backends.py, cores and memory in results_scale.py.

Every child is measured alone (`child.run_child`: wall, CPU, peak RSS by `os.wait4`). Timed jobs
run in interleaved rounds (job order rotated each round) and medians are shown: other jobs share
this machine's 2 cores, and interleaving spreads their noise over every job alike.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
from child import Run, run_child
from results_md import Table, parse_timings, secs

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


@dataclass
class Data:
    """The inputs every section shares, and the names commands show for their paths."""

    tmp: Path
    tokenizer: Path
    chats: Path  # the first N T0 rows as chats (the side-by-side set)
    contents: list[str]  # their message texts in order, for the bare tokenizer
    names: dict[str, str] = field(default_factory=dict)  # path -> `$NAME` in shown commands
    every: Path | None = None  # every T0 row as chats (`$T0_ALL`), when written
    every_contents: list[str] = field(default_factory=list)  # its message texts in order

    def show(self, cmd: Sequence[str], env: dict[str, str] | None = None) -> str:
        """`cmd` as a user types it: `python` for this interpreter, `$NAME` for known paths."""
        words = ["python" if w == sys.executable else self.names.get(w, w) for w in cmd]
        words = [w.replace(str(self.tmp), "$TMP").replace(f"{REPO}{os.sep}", "") for w in words]
        return "`" + " ".join([*(f"{k}={v}" for k, v in (env or {}).items()), *words]) + "`"


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with the checkout first on PYTHONPATH (its etl, not an installed one)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **(extra or {})}


def etl_cmd(src: Path, dst: Path, tokenizer: Path | str, *extra: str, cache: Path | None = None) -> list[str]:
    """`etl run` at default settings with Qwen2.5 + chatml (only `--template` and the tokenizer set),
    without the token cache unless `cache` names its folder: every round tokenizes, as the peers do."""
    store = ["--no-cache"] if cache is None else ["--cache", str(cache)]
    return [sys.executable, "-m", "etl", "run", str(src), str(dst), "--tokenizer", str(tokenizer),
            "--template", "chatml", "--quiet", *store, *extra]


def rounds_of(jobs: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each job per round; the job order rotates each round."""
    names, out = list(jobs), {name: [] for name in jobs}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            out[name].append(jobs[name]())
    return out


def list_tokens(path: Path) -> int:
    return int(pc.sum(pc.list_value_length(pq.read_table(path, columns=["input_ids"])["input_ids"])).as_py())


def backend_of(dst: Path) -> str:
    """The encoder of an etl output's content, from its manifest's `token_cache.backend`: `gigatoken`
    or `hf`; `none (all from the cache)` when no text was encoded; `-` when it records none (a
    tokenizer that is not a Hugging Face one)."""
    cache = json.loads((dst / "_manifest.json").read_text()).get("token_cache") or {}
    if cache.get("backend"):
        return str(cache["backend"])
    return "none (all from the cache)" if cache.get("dir") and not cache.get("tokenized") else "-"


def startup_table(data: Data, etl_runs: list[Run], rounds: int) -> Table:
    """`startup*` of etl's `--timings` line when it prints one; else imports + tokenizer load measured here."""
    timings = [parse_timings(r.output) for r in etl_runs]
    keys = sorted({k for t in timings for k in t if k.startswith("startup")})
    columns = ["figure", "command", "seconds, median (range)"]
    if keys:
        rows = [[k, "`etl run ... --timings` (the side-by-side's etl runs)", secs([t[k] for t in timings if k in t])] for k in keys]
        worst = max(statistics.median(t[k] for t in timings if k in t) for k in keys)
        return Table("Start-up before the first record is parsed (goal < 0.5 s)", columns, rows,
                     [(f"Read from the `startup` figure(s) of `etl run --timings`; goal (under 0.5 s): "
                      f"**{'met' if worst < 0.5 else 'not met'}**.")])
    script = ("import time; t0 = time.perf_counter(); import etl.cli, etl.commands.run, etl.pipeline.run; "
              "t1 = time.perf_counter(); from etl.tokens.loading import load_tokenizer; load_tokenizer(__import__('sys').argv[1]); "
              "print(t1 - t0, time.perf_counter() - t1)")
    cmd = [sys.executable, "-c", script, str(data.tokenizer)]
    parts: list[tuple[float, float, float]] = []
    for _ in range(rounds):
        run = run_child(cmd, env=child_env(), cwd=str(REPO))
        imports, load = map(float, run.output.split()[-2:])
        parts.append((imports, load, run.wall))
    rows = [[label, "`python -c 'import etl.cli, etl.commands.run, etl.pipeline.run; load_tokenizer($QWEN)'`",
             secs([p[i] for p in parts])] for i, label in enumerate(("imports (etl CLI, run command, pipeline)", "tokenizer load (Qwen2.5 tokenizer.json)", "whole child process (with interpreter start)"))]
    note = ("`etl run --timings` prints no `startup` figure in this build, so start-up is measured here as the import "
            "of what `etl run` imports before reading plus loading the tokenizer, in a child process; the first "
            "record's parse is not included.")
    both = statistics.median(p[0] + p[1] for p in parts)
    verdict = f"Imports + tokenizer load: **{both:.2f} s; goal (under 0.5 s) {'met' if both < 0.5 else 'not met'}**."
    return Table("Start-up before the first record is parsed (goal < 0.5 s)", columns, rows, [note, verdict])
