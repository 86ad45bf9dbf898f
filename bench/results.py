"""Every benchmark figure of etl in one run on one machine, written to bench/results.md (`make bench`).

T0-train-50k (../shared/data) rewritten as chats (prompt -> user, completion without GPT-3's
`<|endoftext|>` marker -> assistant), Qwen2.5 tokenizer, `--template chatml`, etl's other settings
at their defaults (default system message, S = 2048, 16 MiB chunks). Sections: etl run (cold and
warm, with its default backend and with `--tokenizer-backend hf`) vs the bare tokenizers and two
peers (a per-example loop, HF datasets' batched map) on the first 20k chats; etl vs a bare
`tokenizers` `encode_batch` on all 55k chats; start-up; 1 vs 2 cores; local vs ray engine; peak RSS
at 10x and 50x a 5k-chat slice with each backend; packing; loader tokens/s padded and packed; the token
cache (all of T0: a rerun at another S, the cost of filling it); token balance; speed at scale (T0 x10, 650 MB, against a bare read_ndjson + gigatoken bound); Ray on T0 x10
(local, self-started, a cluster of 1 and of 2 CPUs); images; preference pairs (hh-rlhf: etl vs TRL's `_prepare_dataset`, padded vs prefix-shared packed).
Each figure comes with its command. About 13-16 minutes; `--quick` (2k chats, 2x and 4x a 1k slice,
one round) about 5 minutes, 2 of them bench/engines.py's (all of T0 even then).

    python bench/results.py [--quick] [--out bench/results.md] [--rounds R] [--tokenizer DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

# The bench modules import each other by name; this checkout's etl, not an installed one, is measured.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from child import Run, run_child
from etl_throughput import QWEN, T0, write_chats
from results_backends import all_table, side_by_side
from results_etl import REPO, Data, child_env, etl_cmd, startup_table
from results_loader import lengths_of, loader_table, packing_table
from results_md import Table, machine_facts, render
from results_scale import cores_table, engines, memory_table, optional_table

MARKER = "<|endoftext|>"


@dataclass(frozen=True)
class Settings:
    rows: int  # chats in the side-by-side, cores and engine runs
    slice_rows: int  # chats in the slice that the memory runs repeat
    factors: tuple[int, int]
    rounds: int
    all_rows: int | None  # chats behind the packing and loader tables (None: all 55,185)
    loader_batches: int
    pack_repeats: int


FULL = Settings(rows=20_000, slice_rows=5_000, factors=(10, 50), rounds=3, all_rows=None, loader_batches=300, pack_repeats=3)
QUICK = Settings(rows=2_000, slice_rows=1_000, factors=(2, 4), rounds=1, all_rows=2_000, loader_batches=20, pack_repeats=1)


def prepare(tmp: Path, settings: Settings, tokenizer: Path) -> tuple[Data, Path]:
    """The chats, the memory slice and the loader's T0 input written once; returns (data, slice)."""
    chats = tmp / "t0-chats.jsonl"
    contents = write_chats(settings.rows, chats, strip_suffix=MARKER)
    slice_path = tmp / "t0-slice.jsonl"
    with chats.open(encoding="utf-8") as src:
        slice_path.write_text("".join(line for _, line in zip(range(settings.slice_rows), src, strict=False)), encoding="utf-8")
    every = tmp / "t0-all.jsonl"
    every_contents = write_chats(settings.all_rows, every, strip_suffix=MARKER)
    names = {str(chats): "$T0_CHATS", str(every): "$T0_ALL", str(tokenizer): "$QWEN", str(slice_path): "$SLICE",
             str(tmp / "t0-all-out"): "$T0_ALL_OUT"}
    return Data(tmp, tokenizer, chats, contents, names, every, every_contents), slice_path


def header(settings: Settings, args: argparse.Namespace, data: Data, elapsed: float, load: tuple[float, float]) -> list[str]:
    """Machine facts, what the data is, what the `$NAME`s in commands stand for, and the noise caveat."""
    command = "python bench/results.py" + (" --quick" if args.quick else "")
    return [
        (f"Written by `{command}` (`make bench`) on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC in "
        f"{elapsed / 60:.1f} min. Regenerate it after changes; figures from another machine do not compare."),
        *machine_facts(REPO),
        (f"Data: `$T0_CHATS` = the first {settings.rows:,} rows of `../shared/data/t0-train-50k/"
        "t0_train_50k_per_template.jsonl.gz` as chat JSONL (prompt -> user, completion without its trailing "
        f"`{MARKER}` -> assistant; `bench.etl_throughput.write_chats`); `$T0_ALL` = "
        f"{'all 55,185' if settings.all_rows is None else f'the first {settings.all_rows:,}'} rows the same way; "
        f"`$SLICE` = the first {settings.slice_rows:,} chats; `$QWEN` = `../shared/data/qwen2.5-tokenizer`; `$TMP` "
        "= a temporary folder. etl runs with `--template chatml` and every other setting at its default "
        "(default system message, S = 2048, 16 MiB chunks), with this checkout first on `PYTHONPATH`."),
        (f"Noise: other jobs may share this machine's cores while this runs (load average {load[0]:.2f} at "
        f"the start, {load[1]:.2f} at the end). Timed jobs run in {settings.rounds} interleaved round(s), job "
        "order rotated; medians (and ranges) shown, with CPU seconds, which move less than wall seconds. "
        "Ratios of jobs measured side by side hold better than absolute times."),
    ]


def section(name: str, build: Callable[[], Table], failures: list[str]) -> Table:
    """Run one section; a failure becomes a note in its place (and a non-zero exit) instead of losing the rest."""
    started, load = time.perf_counter(), os.getloadavg()[0]
    print(f"[bench] {name} ...", file=sys.stderr, flush=True)
    try:
        table = build()
    except Exception as exc:  # noqa: BLE001 - reported in the file and by the exit status
        failures.append(name)
        table = Table(name, [], notes=[f"**Failed**: {type(exc).__name__}: {exc}"])
    seconds = time.perf_counter() - started
    table.notes.append(f"_Section took {seconds:.0f} s; load average {load:.1f} at its start, {os.getloadavg()[0]:.1f} at its end._")
    print(f"[bench] {name}: {seconds:.0f} s", file=sys.stderr, flush=True)
    return table


def sections(data: Data, slice_path: Path, settings: Settings, failures: list[str]) -> list[Table]:
    """Every table, in the order of results.md."""
    etl_runs: list[Run] = []
    s = settings
    tables = [section("side by side", lambda: side_by_side(data, s.rounds, etl_runs), failures),
              section("all of T0", lambda: all_table(data, s.rounds), failures),
              section("start-up", lambda: startup_table(data, etl_runs, s.rounds), failures),
              section("cores", lambda: cores_table(data, s.rounds), failures),
              section("engines", lambda: engines(data, s.rounds), failures),
              section("memory", lambda: memory_table(data, slice_path, s.slice_rows, s.factors, s.rounds), failures)]
    every = data.tmp / "t0-all-out"  # written by the all-of-T0 section; again here if it failed
    if not (every / "_manifest.json").is_file():
        run_child(etl_cmd(data.tmp / "t0-all.jsonl", every, data.tokenizer), env=child_env(), cwd=str(REPO))
    tables += [section("packing", lambda: packing_table(lengths_of(every), 2048, s.pack_repeats), failures),
               section("loader", lambda: loader_table(data, every, s.loader_batches), failures),
               section("token cache", lambda: optional_table("token_cache", "Token cache (T0, all chats)"), failures),
               section("token balance", lambda: optional_table("token_balance", "Token balance"), failures),
               section("scale", lambda: optional_table(
                   "scale", "Speed at scale: etl cold on T0 x10 against the bare parse + encode bound"), failures),
               section("ray scale", lambda: optional_table(
                   "ray_scale", "Ray at scale: T0 x10, local vs Ray, 1 and 2 worker CPUs"), failures),
               section("images", lambda: optional_table(
                   "images", "Images: etl vs a datasets.map doing LLaMA-Factory's work; memory"), failures),
               section("preference", lambda: optional_table(
                   "preference", "Preference data: etl vs TRL's `_prepare_dataset`, padded vs prefix-shared packed"),
                   failures)]
    return tables


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a smoke run: 2k chats, 2x and 4x a 1k slice, one round")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results.md")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds of the timed jobs (default 3, quick 1)")
    p.add_argument("--tokenizer", type=Path, default=QWEN, help="a Hugging Face tokenizer directory (default Qwen2.5)")
    args = p.parse_args()
    if not T0.exists() or not args.tokenizer.exists():
        print(f"benchmark data not found ({T0}, {args.tokenizer}); it lives in ../shared/data", file=sys.stderr)
        return 1
    settings = QUICK if args.quick else FULL
    if args.rounds:
        settings = Settings(**{**settings.__dict__, "rounds": args.rounds})
    started, load = time.perf_counter(), os.getloadavg()[0]
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="etl-results-") as tmp:
        data, slice_path = prepare(Path(tmp), settings, args.tokenizer.resolve())
        tables = sections(data, slice_path, settings, failures)
    lines = header(settings, args, data, time.perf_counter() - started, (load, os.getloadavg()[0]))
    args.out.write_text(render("etl benchmark results", lines, tables), encoding="utf-8")
    print(f"wrote {args.out}" + (f"; failed sections: {', '.join(failures)}" if failures else ""), file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
