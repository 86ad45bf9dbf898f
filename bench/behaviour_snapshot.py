"""A snapshot of what a user sees, to prove a refactor changed none of it.

    python bench/behaviour_snapshot.py OUT.json [--tree DIR]   # DIR: a checkout (default: this one)
    diff <(jq -S . before.json) <(jq -S . after.json)

It records, for the etl importable from DIR: every command's `--help`, `etl config` and
`etl config --schema`, the exit status and stderr of bad invocations (flags and config files),
and the sha256 of every file of a set of runs (SFT with the built-in tokenizer, preference,
unpaired, a quick-start config, and, where ../shared/data holds it, Qwen2.5, Qwen3 and Phi-3 with
their own templates and a mixture) plus `etl stats` and `etl inspect` on them. Runs write to
one fixed folder so paths inside outputs match between trees; inputs are read from this
checkout's examples/ and tests/assets/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
COMMANDS = ("run", "stats", "report", "inspect", "export", "pack", "cache", "check-template", "config")
PAIRS = ROOT / "tests/assets/preference"
BAD_CONFIGS = (
    {"seq_len": 3}, {"seq_len": "8"}, {"truncation": "nope"}, {"input": {"type": "nope"}},
    {"mask": {"robot": "train"}}, {"preprocessing": {"min_chars": 3}}, {"split": {"val_fraction": 1}},
    {"sources": []}, {"sources": [{"path": "a.jsonl", "weight": 1}, {"path": "b.jsonl"}]},
    {"output": {"max_tokens_per_shard": 5}}, {"unknown": 1}, {"mask_options": {"eot": "x"}},
    {"input": {"type": "preference"}, "truncation": "drop_oldest_turns"},
    {"input": {"type": "chat"}, "truncation": "keep_start"},
    {"sources": [{"path": "a.jsonl", "name": "a b"}]}, {"mix_total": "first_exhausted"},
)
BAD_FLAGS = (
    ["--seq-len", "3"], ["--chunk-mb", "0"], ["--max-record-mb", "-1"], ["--truncation", "x"],
    ["--input-type", "nope"], ["--pair-fit", "shared"], ["--template", "nope"], ["--tokenizer", "/nope"],
    ["--seq-len", "3", "--config", str(ROOT / "examples/configs/sft.toml")],
    ["--truncation", "keep_start", "--config", str(ROOT / "examples/configs/sharegpt.json")],
    ["--max-record-mb", "0.5", "--chunk-mb", "2000"], ["--no-default-system", "--input-type", "text", "--seq-len", "5"],
)


def _etl(tree: Path, *args: str, cwd: Path = ROOT) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "100"}
    done = subprocess.run([sys.executable, "-P", "-m", "etl", *args], cwd=cwd, env=env, capture_output=True, check=False,
                          text=True, timeout=600)
    return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def _files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _runs() -> dict[str, list[str]]:
    runs = {
        "sft_bytes": [str(ROOT / "examples/raw")],
        "sft_bytes_s64": [str(ROOT / "examples/raw"), "--seq-len", "64", "--truncation", "keep_prefix"],
        "preference": [str(PAIRS / "pairs.jsonl"), "--input-type", "preference"],
        "preference_shared": [str(PAIRS / "pairs.jsonl"), "--input-type", "preference", "--pair-fit", "shared",
                              "--seq-len", "64", "--truncation", "keep_end"],
        "unpaired": [str(PAIRS / "unpaired.jsonl"), "--input-type", "unpaired"],
        "quick_start": [str(ROOT / "tests/assets/quick_start/instruction.jsonl"), "--input-type", "instruction"],
        "sft_config_and_flags": [str(ROOT / "examples/raw"), "--config", str(ROOT / "examples/configs/sft.toml"),
                                 "--seq-len", "96", "--no-default-system", "--chunk-mb", "0.01"],
        "text_flag": [str(ROOT / "tests/assets/quick_start/instruction.jsonl"), "--input-type", "text",
                      "--seq-len", "32"],
    }
    for name in ("qwen2.5", "qwen3", "phi3"):
        tok = SHARED / f"{name}-tokenizer"
        if tok.is_dir():
            runs[f"sft_{name}"] = [str(ROOT / "tests/assets/hostile/whitespace.jsonl"), "--tokenizer", str(tok)]
            runs[f"pairs_{name}"] = [str(PAIRS / "pairs.jsonl"), "--input-type", "preference", "--tokenizer", str(tok)]
    if (SHARED / "qwen2.5-tokenizer").is_dir():
        runs["mixture"] = ["", "--config", str(ROOT / "examples/configs/mixture.toml")]
        runs["mixture_flags"] = ["", "--config", str(ROOT / "examples/configs/mixture.toml"), "--seq-len", "96",
                                 "--truncation", "drop", "--no-default-system", "--template", "hf"]
    return runs


def snapshot(tree: Path) -> dict:
    out: dict = {"help": {c: _etl(tree, c, "--help") for c in ("", *COMMANDS) if c} | {"": _etl(tree, "--help")}}
    out["config"] = _etl(tree, "config")
    out["schema"] = _etl(tree, "config", "--schema")
    work = Path(tempfile.gettempdir()) / "etl_behaviour_snapshot"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    src = str(ROOT / "examples/raw")
    out["bad_configs"] = []
    for doc in BAD_CONFIGS:
        (work / "bad.json").write_text(json.dumps(doc))
        out["bad_configs"].append(_etl(tree, "run", src, str(work / "dst"), "--config", str(work / "bad.json")))
    out["bad_flags"] = [_etl(tree, "run", src, str(work / "dst"), *flags) for flags in BAD_FLAGS]
    out["runs"] = {}
    for name, args in _runs().items():
        dst = work / "dst"
        shutil.rmtree(dst, ignore_errors=True)
        src, *flags = args  # SRC, DST, then flags: SRC and DST are optional positionals
        result = _etl(tree, "run", *([src, str(dst)] if src else [str(dst)]), *flags, "--no-cache", cwd=ROOT)
        result["files"] = _files(dst) if dst.is_dir() else {}
        if result["rc"] in (0, 3):
            result["stats"] = _etl(tree, "stats", str(dst))
            result["inspect"] = _etl(tree, "inspect", str(dst), "--row", "0", "--plain")
        out["runs"][name] = result
    shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="the JSON snapshot to write")
    p.add_argument("--tree", default=str(ROOT), help="the checkout whose etl runs (default: this one)")
    args = p.parse_args()
    Path(args.out).write_text(json.dumps(snapshot(Path(args.tree).resolve()), indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
