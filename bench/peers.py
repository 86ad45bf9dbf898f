"""Peers of `etl run` on the same job: chat JSONL -> input_ids + assistant mask -> Parquet.

Two ways a trainer's own data prep does it with transformers (TRL, axolotl):

- `per_example`: one conversation at a time, `apply_chat_template(tokenize=True)`, then each
  assistant turn masked by prefix difference (the ids of the conversation up to the turn with
  the generation prompt, and up to the turn's `<|im_end|>`).
- `hf_map`: `datasets` `load_dataset("json")` + `Dataset.map(batched=True, num_proc=N)`: the
  batch rendered with `apply_chat_template(tokenize=False)`, tokenized in one call with offsets,
  a token trained when its characters lie between the same two prefixes.

Both train what etl trains (assistant content and its `<|im_end|>`, not the newline after it) and
give the conversation etl's default system message (Qwen2.5's template would insert its own).

    python bench/peers.py {per_example,hf_map} SRC.jsonl DST.parquet [--tokenizer DIR] [--num-proc 2]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SYSTEM = "you are a helpful assistant."  # etl.columns.DEFAULT_SYSTEM_TEXT, not imported: a peer runs without etl
QWEN = Path(__file__).resolve().parents[2] / "shared" / "data" / "qwen2.5-tokenizer"
Messages = list[dict[str, Any]]


def with_system(messages: Messages) -> Messages:
    """The conversation with etl's default system message first, unless it has one."""
    return messages if messages and messages[0]["role"] == "system" else [{"role": "system", "content": SYSTEM}, *messages]


def example_ids(tok: Any, messages: Messages) -> tuple[list[int], list[int]]:
    """(input_ids, assistant mask) of one conversation, by prefix difference per assistant turn."""
    msgs = with_system(messages)
    ids = tok.apply_chat_template(msgs, tokenize=True, return_dict=True)["input_ids"]
    mask = [0] * len(ids)
    for i, message in enumerate(msgs):
        if message["role"] != "assistant":
            continue
        start = len(tok.apply_chat_template(msgs[:i], tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"])
        end = len(ids) if i == len(msgs) - 1 else len(
            tok.apply_chat_template(msgs[: i + 1], tokenize=True, return_dict=True)["input_ids"])
        while end > start and ids[end - 1] != tok.eos_token_id:  # the newline after <|im_end|>
            end -= 1
        mask[start:end] = [1] * (end - start)
    return ids, mask


def per_example(src: Path, dst: Path, tokenizer: Path) -> None:
    """The per-example loop over a JSONL file."""
    import json

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    ids, masks = [], []
    with src.open(encoding="utf-8") as f:
        for line in f:
            i, m = example_ids(tok, json.loads(line)["messages"])
            ids.append(i)
            masks.append(m)
    pq.write_table(pa.table({"input_ids": ids, "assistant_masks": masks}), dst)


def char_spans(tok: Any, msgs: Messages) -> list[tuple[int, int]]:
    """Character spans [start, end) of the trained text of each assistant turn in the rendered text."""
    spans = []
    for i, message in enumerate(msgs):
        if message["role"] == "assistant":
            start = len(tok.apply_chat_template(msgs[:i], tokenize=False, add_generation_prompt=True))
            through = tok.apply_chat_template(msgs[: i + 1], tokenize=False)
            spans.append((start, through.rindex(tok.eos_token) + len(tok.eos_token)))
    return spans


def map_batch(batch: dict[str, list[Any]], tok: Any) -> dict[str, list[Any]]:
    """A `Dataset.map` batch: render, tokenize all texts at once, mask tokens inside the spans."""
    convs = [with_system(m) for m in batch["messages"]]
    texts = tok.apply_chat_template(convs, tokenize=False)
    enc = tok(texts, add_special_tokens=False, return_offsets_mapping=True)
    masks = []
    for msgs, offsets in zip(convs, enc["offset_mapping"], strict=True):
        starts = np.fromiter((s for s, _ in offsets), dtype=np.int64, count=len(offsets))
        ends = np.fromiter((e for _, e in offsets), dtype=np.int64, count=len(offsets))
        mask = np.zeros(len(offsets), dtype=np.int8)
        for lo, hi in char_spans(tok, msgs):
            mask[(starts >= lo) & (ends <= hi)] = 1
        masks.append(mask.tolist())
    return {"input_ids": enc["input_ids"], "assistant_masks": masks}


def hf_map(src: Path, dst: Path, tokenizer: Path, num_proc: int) -> None:
    """`datasets` batched map with `num_proc` processes; a fresh cache, so nothing is reused."""
    from datasets import disable_progress_bars, load_dataset
    from transformers import AutoTokenizer

    disable_progress_bars()
    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    with tempfile.TemporaryDirectory() as cache:
        data = load_dataset("json", data_files=str(src), split="train", cache_dir=cache)
        out = data.map(map_batch, fn_kwargs={"tok": tok}, batched=True, num_proc=num_proc,
                       remove_columns=data.column_names, load_from_cache_file=False)
        out.to_parquet(str(dst))


def differing_rows(etl_dst: Path, peer: Path) -> tuple[int, list[int]]:
    """(rows compared, source lines whose ids or mask differ) of etl's output against a peer's.

    etl's rows are matched to the peer's by `source_line` (0-based line of the JSONL); its
    `loss_mask` is compared with the peer's assistant mask.
    """
    ours = pq.read_table(etl_dst / "data", columns=["source_line", "input_ids", "loss_mask"])
    theirs = pq.read_table(peer)
    ids, masks = theirs["input_ids"].to_pylist(), theirs["assistant_masks"].to_pylist()
    bad = []
    for line, i, m in zip(*(ours[c].to_pylist() for c in ("source_line", "input_ids", "loss_mask")), strict=True):
        if ids[line] != i or [bool(x) for x in masks[line]] != m:
            bad.append(line)
    return ours.num_rows, bad


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("peer", choices=["per_example", "hf_map"])
    p.add_argument("src", type=Path, help="chat JSONL (`messages` per line)")
    p.add_argument("dst", type=Path, help="Parquet file to write (input_ids, assistant_masks)")
    p.add_argument("--tokenizer", type=Path, default=QWEN, help="a Hugging Face tokenizer directory")
    p.add_argument("--num-proc", type=int, default=2, help="hf_map: datasets' num_proc")
    args = p.parse_args()
    if args.peer == "per_example":
        per_example(args.src, args.dst, args.tokenizer)
    else:
        hf_map(args.src, args.dst, args.tokenizer, args.num_proc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
