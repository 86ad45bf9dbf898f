"""A complete (tiny) SFT loop on `etl run` output: what a training script imports from etl.

    make etl                                   # examples/raw -> parquet/ (byte tokenizer)
    .venv/bin/python examples/train_tiny.py parquet/ --steps 200

It prints a line every --log-every steps, and at least every LOG_SECONDS. Batches are padded to
their longest example (``collate="longest"``), not to T = S - 1: the sample's examples are a few
dozen to a few hundred tokens, so a step runs over that many positions, not 2047.

The model is a byte-level bigram-plus-context toy (embedding -> GRU -> logits); the point is
the data path: `ParquetLoader` batches, `y` already -100 where not trained, a checkpoint of
the loader state next to the model's, and resuming it. `examples/train_hf.py` trains a
transformers model on packed batches instead.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F

from etl.columns import IGNORE_INDEX
from etl.loader import ParquetLoader
from etl.output.manifest import read_manifest

# Longest silence between progress lines: a line every N steps alone could leave long silences
# on a busy CPU (a step padded to T = 2047 took 5-35 s on 2 busy cores).
LOG_SECONDS = 10.0


class TinyLM(torch.nn.Module):
    """Embedding -> GRU -> vocabulary logits; enough to memorize a few hundred examples."""

    def __init__(self, vocab_size: int, width: int = 128) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, width)
        self.rnn = torch.nn.GRU(width, width, batch_first=True)
        self.head = torch.nn.Linear(width, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(x))
        return self.head(hidden)


def train(
    dst: str, *, steps: int, batch_size: int, seq_len: int | None, lr: float, seed: int,
    checkpoint: str | None = None, log_every: int = 0,
) -> list[float]:
    """Train for `steps` batches (cycling epochs); returns the loss of every step.

    `log_every` > 0 prints (flushed) the first step, every `log_every`-th, the last, and any
    step that ends LOG_SECONDS after the previous line; 0 prints nothing.
    """
    torch.manual_seed(seed)
    vocab = read_manifest(dst)["tokenizer"]["vocab_size"]
    model = TinyLM(vocab)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    # collate="longest": T is the batch's longest example (rounded up to 64), not S - 1.
    loader = ParquetLoader(dst, batch_size=batch_size, seq_len=seq_len, seed=seed, drop_last=False,
                           collate="longest")
    losses: list[float] = []
    if log_every:
        print(f"train_tiny: {len(loader.dataset):,} examples, batch {batch_size}, T = {loader.seq_len - 1}, "
              f"{steps} steps (each batch padded to its longest example)", flush=True)
    start = last = time.monotonic()
    while len(losses) < steps:
        for batch in loader:  # one epoch; x/y (B, T) int64, y = -100 where not trained
            logits = model(batch["x"])
            loss = F.cross_entropy(logits.flatten(0, 1), batch["y"].flatten(), ignore_index=IGNORE_INDEX)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            now = time.monotonic()
            step = len(losses)
            if log_every and (step in (1, steps) or step % log_every == 0 or now - last >= LOG_SECONDS):
                print(f"step {step:4d}/{steps}  loss {losses[-1]:.3f}  ppl {math.exp(losses[-1]):7.1f}  "
                      f"{now - start:6.1f}s", flush=True)
                last = now
            if len(losses) == steps:
                break
    if checkpoint:  # the loader's state resumes at exactly the next batch
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "data": loader.state_dict()}, checkpoint)
    return losses


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dst", help="output folder of `etl run`")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=None, help="S = T + 1 (default: the S of the run)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", help="save model, optimizer and loader state here at the end")
    p.add_argument("--log-every", type=int, default=10, metavar="N",
                   help=f"print a line every N steps (and at least every {LOG_SECONDS:.0f} s); 0: only the summary")
    args = p.parse_args()
    losses = train(args.dst, steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
                   lr=args.lr, seed=args.seed, checkpoint=args.checkpoint, log_every=max(args.log_every, 0))
    print(f"done: loss {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} steps"
          + (f"; checkpoint in {args.checkpoint}" if args.checkpoint else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
