"""Preference pairs: etl vs TRL 1.16's `DPOTrainer._prepare_dataset` on hh-rlhf's 2,312 test pairs
(Qwen2.5, template hf), and padded (TRL's layout) vs prefix-shared packed batches at S = 2048.

Speed: interleaved rounds (job order rotated), medians. etl is a whole cold `etl run` child
(fresh DST, `--no-cache`: start-up, reading the .gz, tokenizing, writing Parquet); TRL is only its
`Dataset.from_list` + `_prepare_dataset` call, timed inside a child after the hh transcripts were
cut into messages (as etl's transcript parser does) and the tokenizer loaded, so TRL's figure
leaves out its imports and set-up: the ratio is the lower bound; a second etl row leaves out
etl's start-up too (`--timings` total less `startup`). CPU seconds include `num_proc` workers. Layout: from etl's own lengths (P, C, R per pair), in file order: a padded
batch of B pairs costs 2 * B * max(P + C, P + R) tokens (chosen rows then rejected rows, padded
to the longest, as TRL's `DataCollatorForPreference`); packed rows hold [P, C, R] of whole pairs,
bfd over P + C + R into rows of S (etl.packing.bfd). Agreement: etl's pairs against TRL's, counted
by `etl.analysis.trl_pairs.compare`. `results()` gives the markdown for results.md.

    python bench/preference.py [--rounds 3] [--batch-size 8] [--seq-len 2048] [--copies 10]
    python bench/preference.py trl NUM_PROC [SRC]   # a child: one timed _prepare_dataset, JSON on stdout
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

# The bench modules import each other by name; this checkout's etl, not an installed one, is measured.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from child import run_child
from results_md import parse_timings

from etl import columns as c
from etl.packing.bins import bfd

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
HH = SHARED / "hh-rlhf" / "harmless-base-test.jsonl.gz"
QWEN = SHARED / "qwen2.5-tokenizer"
NUM_PROCS = (1, 2)  # DPOConfig.dataset_num_proc: TRL's default (None, in-process) and this machine's 2 cores


def trl_child(num_proc: int, src: Path = HH) -> dict[str, float]:
    """One `_prepare_dataset` over every pair of `src`; wall and CPU seconds (its workers included)."""
    from transformers import AutoTokenizer

    from etl.analysis.trl_pairs import hh_record, trl_prepare

    with (gzip.open(src, "rt", encoding="utf-8") if src.suffix == ".gz" else src.open(encoding="utf-8")) as f:
        records = [hh_record(json.loads(line)) for line in f]
    tokenizer = AutoTokenizer.from_pretrained(str(QWEN))

    def cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    wall, used = time.perf_counter(), cpu()
    out = trl_prepare(records, tokenizer, num_proc=None if num_proc == 1 else num_proc)
    return {"wall": time.perf_counter() - wall, "cpu": cpu() - used, "rows": out.num_rows}


def etl_cmd(dst: Path, src: Path = HH) -> list[str]:
    """A cold `etl run` of the hh pairs: a new DST and no token cache, so every round tokenizes."""
    return [sys.executable, "-m", "etl", "run", str(src), str(dst), "--input-type", "preference",
            "--tokenizer", str(QWEN), "--template", "hf", "--no-cache", "--quiet", "--timings"]


def speed(tmp: Path, rounds: int) -> tuple[dict[str, dict[str, list[float]]], Path]:
    """Wall and CPU seconds of every job per round (order rotated); returns them and the last etl DST."""
    jobs = ["etl", *(f"trl{n}" for n in NUM_PROCS)]
    # "whole_cpu": the child's CPU seconds from its start (TRL's imports and set-up included);
    # "work": etl's `--timings` total less its start-up (reading to writing, as TRL's call).
    times: dict[str, dict[str, list[float]]] = {j: {"wall": [], "cpu": [], "whole_cpu": [], "work": []} for j in jobs}
    dst = tmp / "hh"
    for r in range(rounds):
        for job in jobs[r % len(jobs):] + jobs[: r % len(jobs)]:
            if job == "etl":
                dst = tmp / f"hh-{r}"
                run = run_child(etl_cmd(dst), cwd=str(REPO))
                wall, cpu = run.wall, run.cpu
                stages = parse_timings(run.output)
                times[job]["work"].append(stages.get("total", wall) - stages.get("startup", 0.0))
            else:
                run = run_child([sys.executable, __file__, "trl", job[3:]], cwd=str(REPO))
                measured = json.loads(run.output.strip().splitlines()[-1])
                wall, cpu = measured["wall"], measured["cpu"]
            times[job]["wall"].append(wall)
            times[job]["cpu"].append(cpu)
            times[job]["whole_cpu"].append(run.cpu)
            print(f"[preference] round {r + 1} {job}: {wall:.2f} s wall, {cpu:.2f} s CPU", file=sys.stderr, flush=True)
    return times, dst


def speed_table(times: dict[str, dict[str, list[float]]], pairs: int, written: int) -> list[str]:
    """Markdown: pairs/s per job (medians, ranges) and etl's ratio to each TRL job."""
    med = {j: {k: statistics.median(v) for k, v in t.items() if v} for j, t in times.items()}
    names = {"etl": "`etl run --input-type preference --template hf --no-cache` (whole command, cold)",
             **{f"trl{n}": f"TRL `_prepare_dataset`, dataset_num_proc={n}" for n in NUM_PROCS}}
    lines = ["| job | wall s, median (range) | CPU s | pairs/s (wall) | etl's speed-up (wall) | (CPU) |",
             "|---|---:|---:|---:|---:|---:|"]
    for job, t in times.items():
        span = f"{med[job]['wall']:.2f} ({min(t['wall']):.2f}-{max(t['wall']):.2f})"
        up = med[job]["wall"] / med["etl"]["wall"]
        up_cpu = med[job]["cpu"] / med["etl"]["cpu"]
        lines.append(f"| {names[job]} | {span} | {med[job]['cpu']:.2f} | {pairs / med[job]['wall']:,.0f} | "
                     f"{up:.2f}× | {up_cpu:.2f}× |")
    work = statistics.median(times["etl"]["work"])
    lines.append(f"| etl run after its start-up (`--timings` total - startup: parse, tokenize, write) | {work:.2f} | | "
                 f"{pairs / work:,.0f} | {med['trl1']['wall'] / work:.2f}× TRL's dataset_num_proc=1 | |")
    whole = ", ".join(f"dataset_num_proc={n} {med[f'trl{n}']['whole_cpu']:.2f} s "
                      f"({med[f'trl{n}']['whole_cpu'] / med['etl']['cpu']:.2f}× etl's)" for n in NUM_PROCS)
    lines += ["", (f"{pairs:,} pairs read by each job; etl wrote {written:,} (the rest rejected with a reason, "
                   "see its manifest). pairs/s = pairs read / median wall seconds. CPU seconds of the whole TRL "
                   f"child (imports, reading, tokenizer load and the call): {whole}.")]
    return lines


def copies_of_hh(out: Path, copies: int) -> Path:
    """hh's pairs `copies` times, every turn of copy k marked `(k)`: distinct texts, so neither
    side's repeats-tokenized-once helps it; the same file goes to etl and to TRL."""
    with gzip.open(HH, "rt", encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    with out.open("w", encoding="utf-8") as w:
        for k in range(copies):
            for rec in records:
                marked = {side: rec[side].replace("\n\nHuman: ", f"\n\nHuman: ({k}) ")
                          .replace("\n\nAssistant: ", f"\n\nAssistant: ({k}) ") for side in ("chosen", "rejected")}
                w.write(json.dumps(marked) + "\n")
    return out


def scaled_table(tmp: Path, copies: int) -> list[str]:
    """Markdown: one round of etl's whole command against TRL's call (dataset_num_proc=1) on hh x copies."""
    src = copies_of_hh(tmp / f"hh-x{copies}.jsonl", copies)
    etl = run_child(etl_cmd(tmp / f"hh-x{copies}", src), cwd=str(REPO))
    trl = json.loads(run_child([sys.executable, __file__, "trl", "1", str(src)], cwd=str(REPO)).output.splitlines()[-1])
    pairs = json.loads((tmp / f"hh-x{copies}" / "_manifest.json").read_text())["counts"]["read"]
    return [(f"At {copies}x the pairs ({pairs:,}, every copy's turns marked so all texts differ; {src.stat().st_size / 2**20:.1f} "
            f"MiB, so `auto` picks gigatoken), one round: etl's whole cold command {etl.wall:.2f} s wall "
            f"({etl.cpu:.2f} s CPU), TRL's `_prepare_dataset` call (dataset_num_proc=1) {trl['wall']:.2f} s "
            f"({trl['cpu']:.2f} s CPU): **{trl['wall'] / etl.wall:.2f}× by wall time, {trl['cpu'] / etl.cpu:.2f}× by CPU**.")]


def agreement(dst: Path) -> str:
    """One line: etl's pairs in DST against TRL's `_prepare_dataset` on the same hh pairs, by reason."""
    from transformers import AutoTokenizer

    from etl.analysis.trl_pairs import compare, hh_record, pairs_by_line, trl_prepare

    with gzip.open(HH, "rt", encoding="utf-8") as f:
        records = [hh_record(json.loads(line)) for line in f]
    table = pq.read_table(dst / "data", columns=[c.SOURCE_LINE, c.PROMPT_IDS, c.CHOSEN_IDS, c.REJECTED_IDS])
    found = pairs_by_line(table)
    ours = [found.get(line) for line in range(len(records))]
    tokenizer = AutoTokenizer.from_pretrained(str(QWEN))
    counts = compare(tokenizer, trl_prepare(records, tokenizer).to_list(), ours)
    differ = ", ".join(f"{reason} {n:,}" for reason, n in counts["differ"].items())
    return (f"etl vs TRL on the same pairs (`etl.analysis.trl_pairs.compare`): {counts['pairs']:,} pairs in both, "
            f"**{counts['equal']:,} equal** (prompt, chosen and rejected ids); TRL warns on {counts['trl_warns']:,}; "
            f"differ: {differ}; {counts['not_in_etl']:,} rejected by etl (not compared).")


def lengths(dst: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(P, C, R) token counts of every pair of an etl preference output, in file order."""
    cols = [c.SOURCE_LINE, c.NUM_PROMPT_TOKENS, c.NUM_CHOSEN_TOKENS, c.NUM_REJECTED_TOKENS]
    table = pq.read_table(dst / "data", columns=cols).sort_by(c.SOURCE_LINE)
    return tuple(table.column(k).to_numpy().astype(np.int64) for k in cols[1:])  # type: ignore[return-value]


def layout_table(p: np.ndarray, ch: np.ndarray, rj: np.ndarray, *, batch_size: int, seq_len: int) -> list[str]:
    """Markdown: tokens per batch and padding share, padded (TRL) vs prefix-shared packed (bfd at S)."""
    n = len(p)
    longest = np.maximum(p + ch, p + rj)
    starts = np.arange(0, n, batch_size)
    sizes = np.diff(np.append(starts, n))
    padded = 2 * sizes * np.maximum.reduceat(longest, starts)  # (batches,) tokens of each padded batch
    padded_real = int((2 * p + ch + rj).sum())
    shared = p + ch + rj
    over = int((shared > seq_len).sum())
    packing = bfd(shared, seq_len=seq_len)
    packed_real = int(np.minimum(shared, seq_len).sum())
    packed = packing.num_packs * seq_len
    rows = [
        (f"padded, B = {batch_size} pairs (TRL's layout: 2B rows)", len(padded), padded.mean(), int(padded.sum()),
         padded_real, 1 - padded_real / padded.sum()),
        (f"prefix-shared packed, bfd, rows of S = {seq_len}", packing.num_packs, float(seq_len), packed,
         packed_real, 1 - packed_real / packed),
    ]
    lines = ["| layout | batches | tokens per batch | tokens computed | real tokens | padding share | tokens per pair |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {name} | {k:,} | {per:,.0f} | {total:,} | {real:,} | {share:.1%} | {total / n:,.0f} |"
              for name, k, per, total, real, share in rows]
    lines += ["", (f"{n:,} pairs; packed computes {padded.sum() / packed:.2f}× fewer tokens than padded "
                   f"(the prompt once per pair, and no padding). Real tokens: padded counts the prompt in both "
                   f"rows. Pairs longer than S in the shared layout: {over} (clipped to S by bfd).")]
    return lines


def results(rounds: int = 3, batch_size: int = 8, seq_len: int = 2048, copies: int = 10) -> str:
    """Both tables as markdown (bench/results.py's `optional_table`); empty without ../shared."""
    if not (HH.is_file() and QWEN.is_dir()):
        return ""
    with tempfile.TemporaryDirectory(prefix="etl-preference-") as tmp:
        times, dst = speed(Path(tmp), rounds)
        manifest = json.loads((dst / "_manifest.json").read_text())
        pairs, written = manifest["counts"]["read"], manifest["counts"]["written"]
        p, ch, rj = lengths(dst)
        same = agreement(dst)
        scaled = scaled_table(Path(tmp), copies) if copies > 1 else []
    lines = [f"Speed on `../shared/{HH.relative_to(SHARED.parent)}` with Qwen2.5, {rounds} interleaved round(s):", "",
             *speed_table(times, pairs, written), "", *scaled, "", same, "",
             f"Layout at S = {seq_len} (etl's lengths, file order):", "",
             *layout_table(p, ch, rj, batch_size=batch_size, seq_len=seq_len)]
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) in (3, 4) and sys.argv[1] == "trl":
        print(json.dumps(trl_child(int(sys.argv[2]), *(Path(a) for a in sys.argv[3:]))))
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the timed jobs")
    p.add_argument("--batch-size", type=int, default=8, help="pairs per padded batch (TRL's default 8)")
    p.add_argument("--seq-len", type=int, default=2048, help="S, tokens per packed row")
    p.add_argument("--copies", type=int, default=10, help="also time one round on hh this many times (1: not)")
    args = p.parse_args()
    text = results(args.rounds, args.batch_size, args.seq_len, args.copies)
    if not text:
        print(f"benchmark data not found ({HH}, {QWEN}); it lives in ../shared/data", file=sys.stderr)
        return 1
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
