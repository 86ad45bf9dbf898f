"""Train a tiny transformers model on packed `etl run` batches: the data path of a real SFT run.

    make etl                                          # examples/raw -> parquet/ (byte tokenizer)
    .venv/bin/python examples/train_hf.py parquet/    # 50 steps, ~30 s on 2 CPU cores
    .venv/bin/python examples/train_hf.py parquet/ --steps 80 --resume   # 30 more steps

The model is a 2-layer Qwen2 (hidden 128) with random weights and the output's vocabulary, so
it runs anywhere without a download; swap in ``from_pretrained(...)`` for a real one. Batches
are packed (``packing="bfd"``: whole examples back to back in rows of S tokens) and
`etl.train.hf_inputs` turns them into the model's keywords so every example attends only to
itself: packed training equals unpacked training, without padding every example to S.

Every --save-every steps and at the end, --out gets the model (``save_pretrained``: loadable
by transformers as it is) and ``train_state.pt``: the step, the optimizer's state and the
loader's ``state_dict()``. ``--resume`` loads them and continues at exactly the next batch.
--out defaults to ``DST/train_hf/``, inside the output it trains on (etl leaves a folder it did
not write there alone, and a rerun of `etl run` keeps it), never in the current directory.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config
from transformers.utils import logging as hf_logging

from etl.columns import IGNORE_INDEX
from etl.loader import ParquetLoader
from etl.output.manifest import read_manifest
from etl.train import hf_inputs

STATE = "train_state.pt"  # optimizer + loader + step, next to the model's own files
CHECKPOINT = "train_hf"  # --out's default: DST/train_hf, beside the data it was trained on


def default_out(dst: str, out: str | None) -> str:
    """--out as given, else DST/train_hf: the checkpoint stays with its data wherever the command runs."""
    return out if out is not None else str(Path(dst) / CHECKPOINT)


def tiny_model(dst: str, seq_len: int) -> torch.nn.Module:
    """A random 2-layer Qwen2 sized for CPU (~0.4 M parameters with the byte vocabulary)."""
    manifest = read_manifest(dst)
    eos = (manifest.get("eos_ids") or [manifest["eot_id"]])[-1]  # ends generation, as in the data
    config = Qwen2Config(
        # The manifest's vocab_size counts added tokens, so every id of the data has a row.
        vocab_size=manifest["tokenizer"]["vocab_size"], hidden_size=128, intermediate_size=384,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=seq_len, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=eos, pad_token_id=manifest.get("pad_id"),
    )
    # sdpa: hf_inputs gives it a block-diagonal causal mask; it trains on CPU (flex_attention's
    # backward needs CUDA, flash-attn needs CUDA and half precision).
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def setup(dst: str, *, batch_size: int, seq_len: int | None, lr: float, seed: int, out: str | None,
          resume: bool) -> tuple[ParquetLoader, torch.nn.Module, torch.optim.Optimizer, int]:
    """The loader, model, optimizer and last step done: new, or as saved in `out`."""
    torch.manual_seed(seed)
    # drop_last=False: a small output has few packs (the sample: 2 of S = 2048, so a batch of 2
    # is the whole sample), and a short last batch is still a valid step.
    loader = ParquetLoader(dst, batch_size=batch_size, seq_len=seq_len, seed=seed, drop_last=False,
                           packing="bfd")
    if not resume:
        model = tiny_model(dst, loader.seq_len)
        return loader, model, torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01), 0
    # Exact continuation: the same weights, optimizer moments and next batch.
    model = AutoModelForCausalLM.from_pretrained(out, attn_implementation="sdpa")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    state = torch.load(Path(out) / STATE, weights_only=True)
    opt.load_state_dict(state["optimizer"])
    loader.load_state_dict(state["loader"])  # refuses a state saved on other data or options
    return loader, model, opt, state["step"]


def train(dst: str, *, steps: int, batch_size: int, seq_len: int | None, lr: float, seed: int,
          out: str | None, resume: bool = False, save_every: int = 0, threads: int = 1) -> list[float]:
    """Train until step `steps` (cycling epochs), printing every step; returns this run's losses."""
    # A tiny model's ops last ~1 ms: more threads mostly wait for each other, and on a busy machine
    # far worse (50 steps on 2 shared cores: 25 s with 1 thread, 74 s with 2).
    torch.set_num_threads(threads)
    loader, model, opt, step = setup(dst, batch_size=batch_size, seq_len=seq_len, lr=lr, seed=seed,
                                     out=out, resume=resume)
    if resume and step >= steps:
        raise SystemExit(f"--resume: the checkpoint in {out} is at step {step}; pass --steps above it")
    if len(loader) == 0:
        raise SystemExit(f"no batches: {dst} has no training examples of >= 2 tokens")
    print(f"train_hf: {sum(p.numel() for p in model.parameters()):,} parameters, {len(loader.dataset)} "
          f"examples, {len(loader)} batch(es) an epoch of {batch_size} x S = {loader.seq_len} tokens, "
          f"steps {step + 1}..{steps}", flush=True)
    model.train()
    losses: list[float] = []
    start = time.perf_counter()
    real = trained = 0
    last = start
    while step < steps:
        for batch in loader:  # a new `for` is a new epoch; right after load_state_dict, the rest of it
            kw = hf_inputs(batch, model)  # input_ids, labels, position_ids, mask, use_cache=False
            # The mean over this batch's trained labels; to average over a whole optimizer step
            # (accumulation, ranks), add num_items_in_batch=etl.train.count_trained(batches).
            loss = model(**kw).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            losses.append(loss.item())
            now = time.perf_counter()
            dt, last = now - last, now  # the whole step: loading and packing included
            # real = tokens of examples (padding left out); trained = labels that count in the loss
            n_real, n_trained = int(batch["attention_mask"].sum()), int((kw["labels"] != IGNORE_INDEX).sum())
            real, trained = real + n_real, trained + n_trained
            print(f"step {step:4d}/{steps}  loss {losses[-1]:.4f}  tokens/s {n_real / dt:8,.0f} "
                  f"(trained {n_trained / dt:7,.0f})", flush=True)
            if out and (step == steps or (save_every and step % save_every == 0)):
                save(out, model, opt, loader, step)
                last = time.perf_counter()  # the save is not the next step's time
            if step == steps:
                break  # mid-epoch: the saved loader state resumes at the next batch
    wall = time.perf_counter() - start
    if losses:
        print(f"done: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {wall:.1f} s; tokens/s {real / wall:,.0f} "
              f"(trained {trained / wall:,.0f})" + (f"; checkpoint in {out}" if out else ""), flush=True)
    return losses


def save(out: str, model: torch.nn.Module, opt: torch.optim.Optimizer, loader: ParquetLoader, step: int) -> None:
    """The model as transformers saves it, plus what a resume needs to continue exactly."""
    model.save_pretrained(out)
    state = {"step": step, "optimizer": opt.state_dict(), "loader": loader.state_dict()}
    torch.save(state, Path(out) / STATE)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dst", help="output folder of `etl run`")
    p.add_argument("--steps", type=int, default=50, help="train until this step (with --resume: in all)")
    p.add_argument("--batch-size", type=int, default=2, help="packed rows of S tokens per step (default 2)")
    p.add_argument("--seq-len", type=int, default=None, help="S, tokens per packed row (default: the run's)")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate, constant")
    p.add_argument("--seed", type=int, default=0, help="model init and pack order")
    p.add_argument("--out", default=None, help=f"checkpoint folder (default DST/{CHECKPOINT})")
    p.add_argument("--save-every", type=int, default=0, metavar="N", help="also save every N steps")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: fastest for a tiny model)")
    args = p.parse_args(argv)
    args.out = default_out(args.dst, args.out)
    hf_logging.disable_progress_bar()  # save/load progress bars would break up the step lines
    if args.resume and not (Path(args.out) / STATE).exists():
        p.error(f"--resume: no checkpoint in {args.out} (train once with --out {args.out})")
    train(args.dst, steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
          seed=args.seed, out=args.out, resume=args.resume, save_every=args.save_every, threads=args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
