"""examples/train_hf.py trains a transformers model on packed `etl run` batches and resumes exactly."""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import pytest
import torch

from etl.cli import main as etl_main
from etl.loader import ParquetLoader

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
STEP = re.compile(r"^step +(\d+)/(\d+) +loss (\S+) +tokens/s +[\d,]+ \(trained +[\d,]+\)$")


def _script():
    spec = importlib.util.spec_from_file_location("train_hf", ROOT / "examples" / "train_hf.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _steps(text: str) -> dict[int, float]:
    """{step: loss} of the printed step lines."""
    return {int(m[1]): float(m[3]) for line in text.splitlines() if (m := STEP.match(line))}


@pytest.fixture(autouse=True)
def _threads():
    """The script sets torch's thread count for the whole process: give the next test its own."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def dst(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # S = 512: the 17 sample examples make 5 packs, so batches of 2 give 3 steps an epoch and a
    # 4-step run crosses an epoch boundary.
    out = tmp_path_factory.mktemp("train_hf") / "parquet"
    assert etl_main(["run", str(ROOT / "examples" / "raw"), str(out), "--quiet", "--seq-len", "512"]) == 0
    return out


def test_train_hf_prints_a_finite_loss_per_step_and_checkpoints(
    dst: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train_hf, ckpt = _script(), tmp_path / "ckpt"
    assert train_hf.main([str(dst), "--steps", "3", "--out", str(ckpt)]) == 0
    losses = _steps(capsys.readouterr().out)
    assert sorted(losses) == [1, 2, 3]
    assert all(math.isfinite(v) for v in losses.values())
    # Random init over the byte vocabulary (260 ids): the first loss is about ln 260 = 5.56.
    assert abs(losses[1] - math.log(260)) < 0.5
    state = torch.load(ckpt / train_hf.STATE, weights_only=True)
    assert state["step"] == 3 and set(state) == {"step", "optimizer", "loader"}
    assert (ckpt / "config.json").exists() and (ckpt / "model.safetensors").exists()


def test_train_hf_resume_continues_at_the_next_batch(
    dst: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train_hf = _script()
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert train_hf.main([str(dst), "--steps", "4", "--out", str(whole)]) == 0
    uninterrupted = _steps(capsys.readouterr().out)
    assert train_hf.main([str(dst), "--steps", "2", "--out", str(split)]) == 0
    first = _steps(capsys.readouterr().out)
    at_two = torch.load(split / train_hf.STATE, weights_only=True)
    assert train_hf.main([str(dst), "--steps", "4", "--out", str(split), "--resume"]) == 0
    resumed = _steps(capsys.readouterr().out)

    # The resumed run prints steps 3 and 4 only, with the uninterrupted run's losses: same
    # weights, optimizer moments and batches, across the epoch boundary after step 3.
    assert sorted(first) == [1, 2] and sorted(resumed) == [3, 4]
    assert first | resumed == uninterrupted
    a, b = (torch.load(d / train_hf.STATE, weights_only=True) for d in (whole, split))
    assert a["loader"] == b["loader"] and a["step"] == b["step"] == 4

    # The loader state saved at step 2 yields the third batch of an uninterrupted epoch.
    fresh = ParquetLoader(dst, batch_size=2, seed=0, drop_last=False, packing="bfd")
    third = list(fresh)[2]
    again = ParquetLoader(dst, batch_size=2, seed=0, drop_last=False, packing="bfd")
    again.load_state_dict(at_two["loader"])
    assert torch.equal(next(iter(again))["x"], third["x"])


def test_train_hf_resume_without_a_checkpoint_says_how(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _script().main([str(tmp_path), "--resume", "--out", str(tmp_path / "none")])
    assert "no checkpoint in" in capsys.readouterr().err


def test_the_default_checkpoint_is_inside_dst_whatever_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Its own DST: a rerun of `etl run` below must keep the checkpoint, and other tests share `dst`.
    own = tmp_path / "parquet"
    assert etl_main(["run", str(ROOT / "examples" / "raw"), str(own), "--quiet", "--seq-len", "512"]) == 0
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    train_hf = _script()
    assert train_hf.main([str(own), "--steps", "1"]) == 0
    assert f"checkpoint in {own / 'train_hf'}" in capsys.readouterr().out
    assert (own / "train_hf" / train_hf.STATE).is_file() and not any(elsewhere.iterdir())
    # etl leaves the folder it did not write alone: a rerun keeps it, and the loader still reads DST.
    assert etl_main(["run", str(ROOT / "examples" / "raw"), str(own), "--quiet", "--seq-len", "512"]) == 0
    assert (own / "train_hf" / train_hf.STATE).is_file()
    assert train_hf.main([str(own), "--steps", "2", "--resume"]) == 0  # --resume finds it by default too
    assert sorted(_steps(capsys.readouterr().out)) == [2]
