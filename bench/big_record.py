"""Benchmark: peak RSS of `etl run` on one huge chat record, next to the same run without it.

The baseline is `--normal-mb` MB (default 24) of normal chats; the huge-record input is the
same chats with one chat whose user message is `--mb` MB (default 20) of word-like text in the
middle, so the record shares a 16 MiB chunk with normal records. `etl run` runs on each in a
subprocess with Qwen2.5 (`--template chatml`) and with the built-in `bytes` tokenizer; peak RSS
is the child's own `ru_maxrss` (`os.wait4`), so runs do not mix. The huge record runs twice
when etl has `--max-record-mb`: with the default limit (rejected when over it) and with the
limit raised above it (tokenized, then cut to S). "over base" is the record's own cost.

Peaks move by ~50 MiB between runs (how far the parse thread runs ahead); `--repeat N` runs
every case N times and shows the median and the range.

    python bench/big_record.py [--mb 20] [--normal-mb 24] [--seq-len 2048] [--repeat 1] [--tokenizer DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from child import run_child  # bench/ is sys.path[0] when run as a script

QWEN = Path(__file__).resolve().parents[2] / "shared" / "data" / "qwen2.5-tokenizer"
# Mostly English, some accented, CJK and punctuation: ~3.4 bytes per Qwen2.5 token.
WORDS = [
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be", "by",
    "this", "are", "from", "at", "or", "an", "which", "data", "model", "training", "token", "tokenizer",
    "sequence", "memory", "record", "chunk", "parquet", "arrow", "polars", "numpy", "2048", "3.14",
    "naïve", "café", "über", "straße", "数据", "模型", "训练", "—", "“quoted”", "(parenthesised)",
    "[bracketed]", "{braced}", "x=y;",
]


def text_of(n_bytes: int, rng: random.Random) -> str:
    """About n_bytes of word-like text (lines of 12 words, paragraphs), cut from a 0.5 MB block."""
    global _BLOCK
    if not _BLOCK:
        lines = (" ".join(rng.choices(WORDS, k=12)) + ("\n\n" if i % 8 == 7 else "\n") for i in range(6000))
        _BLOCK = "".join(lines)
    start = rng.randrange(len(_BLOCK) // 2)
    whole, part = divmod(n_bytes, len(_BLOCK))
    return (_BLOCK[start:] + _BLOCK[:start]) * whole + _BLOCK[start : start + part]  # ~1 byte per char


_BLOCK = ""


def chat(user: str, assistant: str) -> str:
    msgs = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return json.dumps({"messages": msgs}, ensure_ascii=False) + "\n"


def write_inputs(tmp: Path, mb: float, normal_mb: float) -> tuple[Path, Path]:
    """(normal chats with one huge record in the middle, the same normal chats alone)."""
    rng = random.Random(0)
    small = [chat(text_of(rng.randint(200, 2000), rng), text_of(rng.randint(100, 1500), rng)) for _ in range(256)]
    normal: list[str] = []
    size = 0
    while size < normal_mb * 1e6:
        normal.append(small[len(normal) % len(small)])
        size += len(normal[-1].encode("utf-8"))
    base = tmp / "normal" / "normal.jsonl"
    big = tmp / "big" / "big.jsonl"
    for path in (base, big):
        path.parent.mkdir()
    base.write_text("".join(normal), encoding="utf-8")
    half = len(normal) // 2
    huge = chat(text_of(int(mb * 1e6), rng), "ok, summarised.")
    big.write_text("".join(normal[:half]) + huge + "".join(normal[half:]), encoding="utf-8")
    return big, base


def etl_run(src: Path, dst: Path, tokenizer: str, seq_len: int, extra: list[str]) -> tuple[float, int, dict]:
    """Wall seconds, peak RSS (KiB) of the child alone, and its manifest counts."""
    cmd = [sys.executable, "-m", "etl", "run", str(src), str(dst), "--tokenizer", tokenizer,
           "--template", "chatml", "--seq-len", str(seq_len), "--quiet", *extra]
    try:
        run = run_child(cmd)
    except RuntimeError as exc:
        raise SystemExit(f"etl run failed: {exc}") from exc
    counts = json.loads((dst / "_manifest.json").read_text())["counts"]
    return run.wall, run.peak_kib, counts


def supports_limit() -> bool:
    """Whether this checkout of etl has --max-record-mb (so the bench also runs before the change)."""
    out = subprocess.run([sys.executable, "-m", "etl", "run", "--help"], capture_output=True, text=True, check=False)
    return "--max-record-mb" in out.stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=20.0, help="size of the huge message in MB (default 20)")
    p.add_argument("--normal-mb", type=float, default=24.0, help="MB of normal chats (baseline)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--repeat", type=int, default=1, help="runs per case (median and range shown)")
    p.add_argument("--tokenizer", type=Path, default=QWEN)
    args = p.parse_args()
    tokenizers = ["bytes"]
    if args.tokenizer.exists():
        tokenizers.insert(0, str(args.tokenizer))
    else:
        print(f"{args.tokenizer} not found: bytes tokenizer only", file=sys.stderr)
    limit = supports_limit()
    with tempfile.TemporaryDirectory() as tmp:
        big, base = write_inputs(Path(tmp), args.mb, args.normal_mb)
        record_mb = (big.stat().st_size - base.stat().st_size) / 1e6
        # The limit raised above the record, so that it is tokenized: the cost that must stay bounded.
        raised = ["--max-record-mb", f"{record_mb * 1e6 / (1 << 20) + 1:.0f}"] if limit else []
        print(f"baseline {base.stat().st_size / 1e6:.1f} MB of normal chats; huge-record input: the same + "
              f"one {record_mb:.1f} MB record ({args.mb:g}M characters of text); S = {args.seq_len}")
        print(f"{'tokenizer':<10} {'input':<28} {'peak RSS MiB':>12} {'range':>11} {'over base':>9} "
              f"{'x record':>8} {'wall s':>7}  counts")
        for tok in tokenizers:
            name = "qwen2.5" if tok != "bytes" else "bytes"
            runs = [("normal data (baseline)", base, [])]
            runs += [("huge record, default limit", big, [])]
            if limit:
                runs += [("huge record, limit raised", big, raised)]
            base_mib = None
            for label, src, extra in runs:
                results = [etl_run(src, Path(tmp) / "out", tok, args.seq_len, extra) for _ in range(args.repeat)]
                peaks = sorted(kib / 1024 for _, kib, _ in results)
                mib = statistics.median(peaks)
                base_mib = mib if base_mib is None else base_mib
                secs = statistics.median(s for s, _, _ in results)
                n = results[0][2]
                summary = (f"read {n['read']}, written {n['written']}, "
                           f"rejected {sum(n['rejected'].values())} {dict(n['rejected']) or ''}")
                over = mib - base_mib
                print(f"{name:<10} {label:<28} {mib:12.0f} {f'{peaks[0]:.0f}-{peaks[-1]:.0f}':>11} {over:9.0f} "
                      f"{over * (1 << 20) / (record_mb * 1e6):8.1f} {secs:7.2f}  {summary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
