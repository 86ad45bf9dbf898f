"""Sections of results.md that run `etl run` as a user runs it (a child process each): the
side-by-side with the bare tokenizer and the peers, start-up, 1 vs 2 cores, and peak memory.

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
from etl_throughput import bare_tokenizer
from peers import differing_rows
from results_md import Table, parse_timings, rate, ratio, secs

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

    def show(self, cmd: Sequence[str], env: dict[str, str] | None = None) -> str:
        """`cmd` as a user types it: `python` for this interpreter, `$NAME` for known paths."""
        words = ["python" if w == sys.executable else self.names.get(w, w) for w in cmd]
        words = [w.replace(str(self.tmp), "$TMP").replace(f"{REPO}{os.sep}", "") for w in words]
        return "`" + " ".join([*(f"{k}={v}" for k, v in (env or {}).items()), *words]) + "`"


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with the checkout first on PYTHONPATH (its etl, not an installed one)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **(extra or {})}


def etl_cmd(src: Path, dst: Path, tokenizer: Path | str, *extra: str) -> list[str]:
    """`etl run` at default settings with Qwen2.5 + chatml (only `--template` and the tokenizer set),
    without the token cache: every round tokenizes, as the peers do (bench/token_cache.py times the cache)."""
    return [sys.executable, "-m", "etl", "run", str(src), str(dst), "--tokenizer", str(tokenizer),
            "--template", "chatml", "--quiet", "--no-cache", *extra]


def rounds_of(jobs: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each job per round; the job order rotates each round."""
    names, out = list(jobs), {name: [] for name in jobs}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            out[name].append(jobs[name]())
    return out


def list_tokens(path: Path) -> int:
    return int(pc.sum(pc.list_value_length(pq.read_table(path, columns=["input_ids"])["input_ids"])).as_py())


def side_by_side(data: Data, rounds: int, runs: list[Run]) -> Table:
    """etl run, the bare tokenizer (both batch calls) and the two peers on the same chats.

    `runs` receives etl's own child runs (their `--timings` lines give the start-up figure).
    """
    out, tok = data.tmp / "side", data.tokenizer
    out.mkdir(exist_ok=True)
    peer = [sys.executable, str(BENCH / "peers.py")]
    cmds = {"etl run": etl_cmd(data.chats, out / "etl", tok, "--timings"),
            "per-example loop": [*peer, "per_example", str(data.chats), str(out / "per_example.parquet"), "--tokenizer", str(tok)],
            "HF datasets map": [*peer, "hf_map", str(data.chats), str(out / "hf_map.parquet"), "--tokenizer", str(tok), "--num-proc", "2"]}
    cpu: dict[str, list[float]] = {name: [] for name in cmds}
    counted: dict[str, int] = {}

    def child(name: str) -> float:
        run = run_child(cmds[name], env=child_env(), cwd=str(REPO))
        cpu[name].append(run.cpu)
        runs.extend([run] if name == "etl run" else [])
        return run.wall

    def bare(method: str) -> float:
        seconds, counted["content"] = bare_tokenizer(data.contents, tok, method)
        return seconds

    jobs: dict[str, Callable[[], float]] = {name: (lambda n=name: child(n)) for name in cmds}
    jobs |= {f"bare {m}": (lambda m=m: bare(m)) for m in ("encode_batch", "encode_batch_fast")}
    times = rounds_of(jobs, rounds)
    return side_table(data, cmds, times, cpu, counted["content"], out)


def side_table(data: Data, cmds: dict[str, list[str]], times: dict[str, list[float]],
               cpu: dict[str, list[float]], content: int, out: Path) -> Table:
    """The side-by-side rows, the checks of the peers' ids against etl's, and the goal line."""
    etl_s = statistics.median(times["etl run"])
    written = json.loads((out / "etl" / "_manifest.json").read_text())["counts"]
    rows = []
    for name, seconds in times.items():
        med = statistics.median(seconds)
        tokens = {"etl run": written["tokens"], "per-example loop": list_tokens(out / "per_example.parquet"),
                  "HF datasets map": list_tokens(out / "hf_map.parquet")}.get(name)
        command = data.show(cmds[name]) if name in cmds else (
            f"`bench.etl_throughput.bare_tokenizer(texts, $QWEN, \"{name.split()[1]}\")` (in process; 1,024 texts per call)")
        rows.append([name, command, secs(seconds), f"{statistics.median(cpu[name]):.1f}" if name in cpu else "-",
                     rate(content, med), rate(tokens, med) if tokens else "-", ratio(med / etl_s)])
    notes = [(f"{written['read']:,} chats; {content:,} content tokens (the message texts alone, what the bare tokenizer "
             f"encodes), {written['tokens']:,} written tokens (with the template); etl wrote {written['written']:,} rows, "
             f"truncated {written['truncated']}. Last column: this job's seconds / etl run's seconds (above 1: etl is "
             "faster; below 1: the fraction of the bare tokenizer's rate etl keeps).")]
    notes.append("Peers (`bench/peers.py`, transformers' `AutoTokenizer` on the same tokenizer folder, etl's default "
                 "system message given explicitly): the per-example loop calls `apply_chat_template(tokenize=True)` per "
                 "conversation and masks each assistant turn by prefix difference; the HF map is `load_dataset(\"json\")` + "
                 "`Dataset.map(batched=True, num_proc=2)` rendering with `apply_chat_template(tokenize=False)`, one "
                 "tokenizer call per batch with offsets, the mask from the same prefixes; both write Parquet.")
    for name, file in (("per-example loop", "per_example.parquet"), ("HF datasets map", "hf_map.parquet")):
        compared, bad = differing_rows(out / "etl", out / file)
        notes.append(f"Check: the {name}'s input_ids and assistant mask equal etl's input_ids and loss_mask on "
                     f"{compared - len(bad):,} of {compared:,} rows (every row etl wrote){'' if not bad else f'; differ on source lines {bad[:10]}'}.")
    notes += ratio_notes(times)
    columns = ["job", "command", "wall s, median (range)", "CPU s", "content tok/s", "written tok/s", "its s / etl s"]
    return Table(f"etl run vs the bare tokenizer and the peers (T0, {written['read']:,} chats, Qwen2.5)", columns, rows, notes)


def ratio_notes(times: dict[str, list[float]]) -> list[str]:
    """The ratios of section 1 on medians, and on each job's best round (contention only adds time)."""
    def ratios(pick: Callable[[list[float]], float]) -> dict[str, float]:
        etl_s = pick(times["etl run"])
        return {name: pick(seconds) / etl_s for name, seconds in times.items()}

    med, best = ratios(statistics.median), ratios(min)
    pairs = [("etl / bare encode_batch", "bare encode_batch"), ("etl / bare encode_batch_fast", "bare encode_batch_fast"),
             ("etl / per-example loop", "per-example loop"), ("etl / HF datasets map", "HF datasets map")]
    text = "; ".join(f"{label} = **{ratio(med[name])}** (best rounds {ratio(best[name])})" for label, name in pairs)
    goal = "met" if med["HF datasets map"] >= 3 else "not met"
    return [(f"Ratios of content tok/s (the same tokens for every job), on medians and on each job's best round: {text}. "
            "etl's figure is the whole process (start-up, reading, writing Parquet); the bare tokenizer's is its calls "
            "alone, in process, the tokenizer already loaded."),
            ("Goal (issue 12 point 5): etl run ≥ 3× faster than HF datasets' batched map (num_proc=2) on the same data: "
            f"**{ratio(med['HF datasets map'])} on medians ({ratio(best['HF datasets map'])} on best rounds), {goal}**.")]


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
