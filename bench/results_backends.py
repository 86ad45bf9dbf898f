"""Sections of results.md that put `etl run` beside the tokenizer backends it encodes with and
beside two peers: the side-by-side on `$T0_CHATS` (etl cold and warm with each backend, the bare
backends' batched calls, a per-example loop, HF datasets' map) and etl against a bare `tokenizers`
`encode_batch` on every T0 chat.

etl's backends (`--tokenizer-backend`): the default `auto` encodes content with gigatoken (a Rust
BPE encoder) where it loads the tokenizer, `hf` with the `tokenizers` library; the ids are the
same (the run checks it), so the outputs are too. Each `etl run` is a child measured alone
(`child.run_child`); the bare calls run in this process, their tokenizer loaded before the clock.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from child import Run, run_child
from etl_throughput import bare_gigatoken, bare_tokenizer
from peers import differing_rows
from results_etl import BENCH, REPO, Data, backend_of, child_env, etl_cmd, list_tokens, rounds_of
from results_md import Table, rate, ratio, secs
from token_cache import digests

ETL, ETL_HF = "etl run, cold", "etl run, cold, hf backend"
WARM, WARM_HF = "etl run, warm", "etl run, warm, hf backend"
PER, MAP = "per-example loop", "HF datasets map"
BARE, BARE_FAST, BARE_GIGA = "bare tokenizers encode_batch", "bare tokenizers encode_batch_fast", "bare gigatoken encode_batch"
HF = ("--tokenizer-backend", "hf")
FOLDERS = {ETL: "etl", ETL_HF: "etl-hf", WARM: "warm", WARM_HF: "warm-hf"}  # etl's DSTs under $TMP/side
MAP_GOAL = 8.0  # etl run (default backend, cold) over HF datasets' map, num_proc=2, on $T0_CHATS
BARE_GOAL = 2.5  # etl run's content tok/s over a bare tokenizers encode_batch's, on $T0_ALL
BARE_CALLS = {BARE: '`bench.etl_throughput.bare_tokenizer(texts, $QWEN, "encode_batch")`',
              BARE_FAST: '`bench.etl_throughput.bare_tokenizer(texts, $QWEN, "encode_batch_fast")`',
              BARE_GIGA: "`bench.etl_throughput.bare_gigatoken(texts, $QWEN)` (`gigatoken.Tokenizer($QWEN).encode_batch`)"}
ENCODERS = {PER: "tokenizers (transformers)", MAP: "tokenizers (transformers)", BARE: "tokenizers",
            BARE_FAST: "tokenizers", BARE_GIGA: "gigatoken"}


def side_commands(data: Data, out: Path) -> dict[str, list[str]]:
    """etl cold (`--no-cache`) and warm (`--cache`) with the default and the hf backend, and the peers."""
    tok, peer = data.tokenizer, [sys.executable, str(BENCH / "peers.py")]
    return {ETL: etl_cmd(data.chats, out / FOLDERS[ETL], tok, "--timings"),
            ETL_HF: etl_cmd(data.chats, out / FOLDERS[ETL_HF], tok, *HF),
            WARM: etl_cmd(data.chats, out / FOLDERS[WARM], tok, cache=out / "cache"),
            WARM_HF: etl_cmd(data.chats, out / FOLDERS[WARM_HF], tok, *HF, cache=out / "cache-hf"),
            PER: [*peer, "per_example", str(data.chats), str(out / "per_example.parquet"), "--tokenizer", str(tok)],
            MAP: [*peer, "hf_map", str(data.chats), str(out / "hf_map.parquet"), "--tokenizer", str(tok), "--num-proc", "2"]}


def bare_jobs(contents: list[str], tokenizer: Path, counted: dict[str, int]) -> dict[str, Callable[[], float]]:
    """The bare backends' batched calls over `contents` (1,024 texts per call) as timed jobs;
    `counted` receives each one's content tokens."""
    calls = {BARE: lambda: bare_tokenizer(contents, tokenizer),
             BARE_FAST: lambda: bare_tokenizer(contents, tokenizer, "encode_batch_fast"),
             BARE_GIGA: lambda: bare_gigatoken(contents, tokenizer)}

    def job(name: str) -> float:
        seconds, counted[name] = calls[name]()
        return seconds

    return {name: (lambda n=name: job(n)) for name in calls}


def side_by_side(data: Data, rounds: int, runs: list[Run]) -> Table:
    """etl run cold and warm with each backend, the bare backends and the two peers on the same chats.

    Warm: each backend's token cache is filled by one untimed run before the rounds; every timed
    run writes a fresh DST. `runs` receives the default cold runs (their `--timings` lines give
    the start-up figure).
    """
    out = data.tmp / "side"
    out.mkdir(exist_ok=True)
    cmds = side_commands(data, out)
    for name in (WARM, WARM_HF):
        run_child(cmds[name], env=child_env(), cwd=str(REPO))
    cpu: dict[str, list[float]] = {name: [] for name in cmds}
    counted: dict[str, int] = {}

    def child(name: str) -> float:
        if name in (WARM, WARM_HF):
            shutil.rmtree(out / FOLDERS[name], ignore_errors=True)  # only the cache carries over
        run = run_child(cmds[name], env=child_env(), cwd=str(REPO))
        cpu[name].append(run.cpu)
        runs.extend([run] if name == ETL else [])
        return run.wall

    jobs: dict[str, Callable[[], float]] = {name: (lambda n=name: child(n)) for name in cmds}
    times = rounds_of(jobs | bare_jobs(data.contents, data.tokenizer, counted), rounds)
    return side_table(data, cmds, times, cpu, counted, out)


def side_table(data: Data, cmds: dict[str, list[str]], times: dict[str, list[float]],
               cpu: dict[str, list[float]], counted: dict[str, int], out: Path) -> Table:
    """The side-by-side rows, the checks of ids and bytes, and the ratios with the goal line."""
    content, etl_s = counted[BARE], statistics.median(times[ETL])
    written = {name: backend_counts(out / folder)[1] for name, folder in FOLDERS.items()}
    written |= {PER: list_tokens(out / "per_example.parquet"), MAP: list_tokens(out / "hf_map.parquet")}
    rows = []
    for name, seconds in times.items():
        med = statistics.median(seconds)
        encoder = backend_of(out / FOLDERS[name]) if name in FOLDERS else ENCODERS[name]
        command = data.show(cmds[name]) if name in cmds else f"{BARE_CALLS[name]} (in process; 1,024 texts per call)"
        rows.append([name, encoder, command, secs(seconds), f"{statistics.median(cpu[name]):.1f}" if name in cpu else "-",
                     rate(content, med), rate(written[name], med) if name in written else "-", ratio(med / etl_s)])
    counts = backend_counts(out / FOLDERS[ETL])[0]
    notes = [(f"{counts['read']:,} chats; {content:,} content tokens (the message texts alone, what the bare calls "
              f"encode), {written[ETL]:,} written tokens (with the template); etl wrote {counts['written']:,} rows, "
              f"truncated {counts['truncated']}. Cold: `--no-cache`, every text encoded. Warm: `--cache DIR` on a cache "
              "that one untimed run with the same command filled before the rounds, each timed run into a fresh DST: "
              "no text encoded, no chunk parsed (the manifest names no encoder). Encoder: the manifest's "
              "`token_cache.backend` for etl. Last column: this job's seconds / the default cold etl run's (above 1: "
              "etl is faster; below 1: the fraction of that job's rate etl keeps).")]
    notes.append("Peers (`bench/peers.py`, transformers' `AutoTokenizer` on the same tokenizer folder, etl's default "
                 "system message given explicitly): the per-example loop calls `apply_chat_template(tokenize=True)` per "
                 "conversation and masks each assistant turn by prefix difference; the HF map is `load_dataset(\"json\")` + "
                 "`Dataset.map(batched=True, num_proc=2)` rendering with `apply_chat_template(tokenize=False)`, one "
                 "tokenizer call per batch with offsets, the mask from the same prefixes; both write Parquet.")
    return Table(f"etl run vs the bare tokenizers and the peers (T0, {counts['read']:,} chats, Qwen2.5)",
                 ["job", "encoder", "command", "wall s, median (range)", "CPU s", "content tok/s", "written tok/s",
                  "its s / etl s"], rows, notes + check_notes(out, counted) + ratio_notes(times))


def backend_counts(dst: Path) -> tuple[dict[str, int], int]:
    """(the manifest's counts, its written tokens) of an etl output."""
    counts = json.loads((dst / "_manifest.json").read_text())["counts"]
    return counts, counts["tokens"]


def check_notes(out: Path, counted: dict[str, int]) -> list[str]:
    """The peers' ids and masks against etl's; etl's other runs' bytes against the default cold run's;
    gigatoken's token count against tokenizers'."""
    notes = []
    for name, file in ((PER, "per_example.parquet"), (MAP, "hf_map.parquet")):
        compared, bad = differing_rows(out / FOLDERS[ETL], out / file)
        notes.append(f"Check: the {name}'s input_ids and assistant mask equal etl's input_ids and loss_mask on "
                     f"{compared - len(bad):,} of {compared:,} rows (every row etl wrote){'' if not bad else f'; differ on source lines {bad[:10]}'}.")
    ours = digests(out / FOLDERS[ETL])
    same = [f"{name}: {'byte-identical' if digests(out / FOLDERS[name]) == ours and ours else 'DIFFERENT'}"
            for name in (ETL_HF, WARM, WARM_HF)]
    notes.append(f"Check: etl's data/ and turns/ ({len(ours)} files) against the default cold run's: {'; '.join(same)}. "
                 f"Bare gigatoken counted {counted[BARE_GIGA]:,} content tokens, tokenizers {counted[BARE]:,}"
                 f" ({'the same' if counted[BARE_GIGA] == counted[BARE] else 'DIFFERENT'}).")
    return notes


def speedup(times: dict[str, list[float]], fast: str, slow: str) -> tuple[float, float]:
    """(slow's seconds / fast's, on medians; the same on each job's best round: contention only adds time)."""
    return (statistics.median(times[slow]) / statistics.median(times[fast]), min(times[slow]) / min(times[fast]))


def ratio_notes(times: dict[str, list[float]]) -> list[str]:
    """The ratios of the side-by-side to the default cold etl run, and the goal against HF datasets' map."""
    shown = [name for name in (BARE, BARE_FAST, BARE_GIGA, PER, MAP, ETL_HF, WARM) if name in times]
    text = "; ".join(f"etl / {name} = **{ratio(med)}** (best rounds {ratio(best)})"
                     for name, (med, best) in ((n, speedup(times, ETL, n)) for n in shown))
    med, best = speedup(times, ETL, MAP)
    notes = [(f"Ratios of content tok/s (the same tokens for every job) of etl run (default backend, cold), on medians "
              f"and on each job's best round: {text}. etl's figure is the whole process (start-up, reading, writing "
              "Parquet); the bare calls' are the calls alone, in process, the tokenizer already loaded.")]
    if ETL_HF in times:
        hf_med, hf_best = speedup(times, ETL_HF, MAP)
        notes.append(f"With the hf backend (`--tokenizer-backend hf`, cold): etl / {MAP} = **{ratio(hf_med)}** "
                     f"(best rounds {ratio(hf_best)}).")
    notes.append(f"Goal: etl run ≥ {MAP_GOAL:g}× HF datasets' batched map (num_proc=2) on the same data (default backend, "
                 f"cold): **{ratio(med)} on medians ({ratio(best)} on best rounds), {'met' if med >= MAP_GOAL else 'not met'}**.")
    return notes


def all_goal(times: dict[str, list[float]]) -> str:
    """The goal line of the all-T0 section: etl's content tok/s over the bare encode_batch's."""
    med, best = speedup(times, ETL, BARE)
    return (f"Goal: etl run's content tok/s ≥ {BARE_GOAL:g}× a bare tokenizers `encode_batch`'s over the same contents: "
            f"**{ratio(med)} on medians ({ratio(best)} on best rounds), {'met' if med >= BARE_GOAL else 'not met'}**.")


def all_table(data: Data, rounds: int) -> Table:
    """etl run (cold, default backend) on `$T0_ALL` beside the bare tokenizers and gigatoken
    `encode_batch` over its contents; writes `$T0_ALL_OUT`, which later sections read."""
    if data.every is None:
        raise ValueError("no all-T0 chats: Data.every is set by bench/results.py's prepare()")
    dst = data.tmp / "t0-all-out"
    cmd = etl_cmd(data.every, dst, data.tokenizer)
    cpu: list[float] = []
    counted: dict[str, int] = {}

    def etl() -> float:
        run = run_child(cmd, env=child_env(), cwd=str(REPO))
        cpu.append(run.cpu)
        return run.wall

    bare = bare_jobs(data.every_contents, data.tokenizer, counted)
    times = rounds_of({ETL: etl, BARE: bare[BARE], BARE_GIGA: bare[BARE_GIGA]}, rounds)
    counts, written = backend_counts(dst)
    etl_s, content = statistics.median(times[ETL]), counted[BARE]
    rows = [[name, backend_of(dst) if name == ETL else ENCODERS[name],
             data.show(cmd) if name == ETL else f"{BARE_CALLS[name]} (in process; 1,024 texts per call)", secs(seconds),
             f"{statistics.median(cpu):.1f}" if name == ETL else "-", rate(content, statistics.median(seconds)),
             ratio(statistics.median(seconds) / etl_s)] for name, seconds in times.items()]
    notes = [(f"{counts['read']:,} chats, {content:,} content tokens, {written:,} written tokens. etl's figure is the "
              "whole process, `--no-cache`; the bare calls' are the calls alone. Last column: this job's seconds / etl "
              "run's."), all_goal(times)]
    return Table(f"etl run vs the bare tokenizers on all of T0 ({counts['read']:,} chats, Qwen2.5)",
                 ["job", "encoder", "command", "wall s, median (range)", "CPU s", "content tok/s", "its s / etl s"], rows, notes)
