"""Benchmark: tokens/s of a whole `etl run` next to a bare `Tokenizer.encode_batch` on the same texts.

Default data: ../shared/data/t0-train-50k converted to chats (prompt -> user, completion ->
assistant), Qwen2.5 tokenizer, chatml template. The goal (issue: step 1) is that the whole
pipeline reaches at least 0.8 of the bare tokenizer's rate on the same threads.

    python bench/etl_throughput.py [--rows N] [--tokenizer DIR] [--seq-len S]
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
T0 = SHARED / "t0-train-50k" / "t0_train_50k_per_template.jsonl.gz"
QWEN = SHARED / "qwen2.5-tokenizer"


def write_chats(rows: int | None, out: Path, *, strip_suffix: str = "") -> list[str]:
    """T0 prompt/completion rows as chat JSONL; returns the message contents in order.

    `strip_suffix` removes that text from the end of each completion (T0's completions end in
    GPT-3's `<|endoftext|>` marker, which `apply_chat_template` would read as a special token).
    """
    contents: list[str] = []
    with gzip.open(T0, "rt", encoding="utf-8") as src, out.open("w", encoding="utf-8") as dst:
        for i, line in enumerate(src):
            if rows is not None and i >= rows:
                break
            rec = json.loads(line)
            answer = rec["completion"].removesuffix(strip_suffix) if strip_suffix else rec["completion"]
            msgs = [{"role": "user", "content": rec["prompt"]}, {"role": "assistant", "content": answer}]
            contents += [rec["prompt"], answer]
            dst.write(json.dumps({"messages": msgs}, ensure_ascii=False) + "\n")
    return contents


def bare_tokenizer(contents: list[str], tokenizer: Path, method: str = "encode_batch") -> tuple[float, int]:
    """Seconds and tokens of a bare batched call over the contents, in chunks of 1,024."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    tok.encode_special_tokens = True
    encode = getattr(tok, method)
    started = time.perf_counter()
    n = 0
    for i in range(0, len(contents), 1024):
        n += sum(len(e.ids) for e in encode(contents[i : i + 1024], add_special_tokens=False))
    return time.perf_counter() - started, n


def bare_gigatoken(contents: list[str], tokenizer: Path, per_call: int = 1024) -> tuple[float, int]:
    """Seconds and tokens of gigatoken's own `Tokenizer(dir).encode_batch` over the contents, in
    calls of `per_call` texts (the chunking of `bare_tokenizer`), tokens counted from its awkward result.

    A fresh tokenizer per call of this function (gigatoken caches encodings: the contents are not
    seen twice), warmed by one call on a one-word text before the clock starts: gigatoken's first
    call costs ~0.13 s once per process whatever its size: a start-up cost a run pays once, not a
    rate. Its added tokens stay: the contents must not hold their strings (T0's chats, their
    `<|endoftext|>` stripped, do not).
    """
    import awkward as ak
    import gigatoken

    tok = gigatoken.Tokenizer(str(tokenizer))
    tok.encode_batch(["warm-up"])
    started = time.perf_counter()
    n = 0
    for i in range(0, len(contents), per_call):
        n += int(ak.sum(ak.num(tok.encode_batch(contents[i : i + per_call]))))
    return time.perf_counter() - started, n


def etl_run(src: Path, dst: Path, tokenizer: Path, seq_len: int) -> tuple[float, dict, int]:
    """Seconds, manifest and peak RSS (KiB) of `etl run` as a user runs it."""
    cmd = [sys.executable, "-m", "etl", "run", str(src), str(dst), "--tokenizer", str(tokenizer),
           "--template", "chatml", "--seq-len", str(seq_len), "--no-default-system", "--quiet", "--no-cache"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    subprocess.run(cmd, check=True)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    manifest = json.loads((dst / "_manifest.json").read_text())
    return seconds, manifest, max(peak, before)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=None, help="first N rows of T0 (default all 55,185)")
    p.add_argument("--tokenizer", type=Path, default=QWEN)
    p.add_argument("--seq-len", type=int, default=8192, help="large enough that nothing is cut")
    args = p.parse_args()
    if not T0.exists() or not args.tokenizer.exists():
        print(f"benchmark data not found ({T0}, {args.tokenizer}); it lives in ../shared/data", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "raw" / "t0.jsonl"
        src.parent.mkdir()
        contents = write_chats(args.rows, src)
        bare_s, bare_tokens = bare_tokenizer(contents, args.tokenizer)
        fast_s, _ = bare_tokenizer(contents, args.tokenizer, "encode_batch_fast")
        run_s, manifest, peak_kib = etl_run(src, Path(tmp) / "out", args.tokenizer, args.seq_len)
    counts = manifest["counts"]
    content_rate = bare_tokens / bare_s
    etl_rate = bare_tokens / run_s  # same content tokens, so the ratio compares like with like
    print(f"rows {counts['read']:,}  content tokens {bare_tokens:,}  written tokens {counts['tokens']:,}")
    print(f"bare encode_batch : {bare_s:7.2f} s  {content_rate / 1e6:6.3f} M content tok/s")
    print(f"etl run (process) : {run_s:7.2f} s  {etl_rate / 1e6:6.3f} M content tok/s  "
          f"({counts['tokens'] / run_s / 1e6:.3f} M written tok/s), peak RSS {peak_kib / 1024:.0f} MiB")
    print(f"bare *_fast       : {fast_s:7.2f} s  {bare_tokens / fast_s / 1e6:6.3f} M content tok/s  (what etl calls)")
    print(f"ratio etl / bare encode_batch: {etl_rate / content_rate:.2f}   "
          f"etl / encode_batch_fast: {etl_rate * fast_s / bare_tokens:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
