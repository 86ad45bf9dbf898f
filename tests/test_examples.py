"""The shipped example training loop learns from `etl run` output (the whole path, as a user runs it)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import torch

from etl.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_train_tiny_learns_the_sample(tmp_path: Path) -> None:
    dst = tmp_path / "parquet"
    assert main(["run", str(ROOT / "examples" / "raw"), str(dst), "--quiet", "--seq-len", "129"]) == 0
    spec = importlib.util.spec_from_file_location("train_tiny", ROOT / "examples" / "train_tiny.py")
    assert spec and spec.loader
    train_tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_tiny)
    ckpt = tmp_path / "ckpt.pt"
    losses = train_tiny.train(str(dst), steps=60, batch_size=8, seq_len=129, lr=3e-3, seed=0, checkpoint=str(ckpt))
    # 17 short examples, memorised: the loss on trained tokens falls well below its start
    # (ln 256 + specials ~ 5.5 for a byte vocabulary).
    assert losses[0] > 5.0
    assert sum(losses[-10:]) / 10 < 0.7 * losses[0]
    state = torch.load(ckpt, weights_only=False)
    assert set(state) == {"model", "opt", "data"}


def test_train_tiny_prints_progress_as_it_goes(tmp_path: Path) -> None:
    dst = tmp_path / "parquet"
    assert main(["run", str(ROOT / "examples" / "raw"), str(dst), "--quiet", "--seq-len", "129"]) == 0
    # Without PYTHONUNBUFFERED a pipe is block-buffered: only flushed lines arrive before the end.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | {"PYTHONPATH": str(ROOT)}
    script = ROOT / "examples" / "train_tiny.py"
    cmd = [sys.executable, str(script), str(dst), "--steps", "100000", "--log-every", "1"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env) as proc:
        try:
            assert proc.stdout is not None
            header, first = proc.stdout.readline(), proc.stdout.readline()
            assert proc.poll() is None  # both lines came while it was still training
        finally:
            proc.kill()
    assert header.startswith("train_tiny: ") and "batch 8, T = 128, 100000 steps" in header
    assert first.startswith("step    1/100000  loss ")
