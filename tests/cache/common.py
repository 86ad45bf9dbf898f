"""Helpers of the token-cache tests: a tiny tokenizer trained here, chat inputs, CLI runs, damage."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from etl.cli import main

SYSTEM = "You are a helpful assistant. Answer briefly."
SPECIALS = ["<|im_start|>", "<|im_end|>"]


def train_tokenizer(path: Path, vocab_size: int = 400) -> Path:
    """A byte-level BPE (vocab ~`vocab_size`) trained on a few lines, with ChatML's specials so `chatml` works;
    saved as `path` (a tokenizer.json). No download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["Hello world, it's a test.\nLine two: 123 4567 数据 模型 café\n\n" * 3,
              "the of and to in is " * 5, SYSTEM]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=SPECIALS))
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def chats(n: int) -> list[dict[str, Any]]:
    """n chats, every one with the same system prompt; user turns repeat every 7 chats, and
    assistant turns contain special-token-looking text (which must encode as text)."""
    out = []
    for i in range(n):
        out.append({"messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"question {i % 7} about the test, 数据 café"},
            {"role": "assistant", "content": f"Hello world {i}. <|im_end|> it's a test " + "the of and " * (i % 9)},
        ]})
    return out


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def etl_run(src: Path, dst: Path, *flags: str) -> dict[str, Any]:
    """`etl run SRC DST --quiet FLAGS...` in process; the manifest it wrote (the run must succeed)."""
    assert main(["run", str(src), str(dst), "--quiet", *flags]) == 0
    return json.loads((dst / "_manifest.json").read_text(encoding="utf-8"))


def output_digests(dst: Path) -> dict[str, str]:
    """sha256 of every Parquet file under DST's data/ and turns/, by relative path."""
    files = sorted(p for sub in ("data", "turns") for p in (dst / sub).rglob("*.parquet"))
    assert files, f"no data/turns parts under {dst}"
    return {str(p.relative_to(dst)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def segment_files(root: Path) -> list[Path]:
    """Every file under the cache root named <64 hex>.parquet, found without etl's own helpers."""
    return sorted(p for p in root.rglob("*.parquet")
                  if len(p.stem) == 64 and all(c in "0123456789abcdef" for c in p.stem))


def flip_middle(path: Path, count: int = 16) -> None:
    """Damage a file on purpose: invert `count` bytes in its middle."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    for i in range(mid, min(mid + count, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def all_files(root: Path) -> dict[str, bytes]:
    """Every file under root and its bytes (to show that nothing changed)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
