"""ParquetLoader end to end: token conservation, workers, epochs, resume in a new process."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch

from etl.columns import IGNORE_INDEX
from etl.errors import EtlError
from etl.loader.dataloader import ParquetLoader
from etl.loader.groups import PadOptions, SamplerOptions

from .conftest import random_examples, write_dst

HERE = Path(__file__).parent


def trained_targets(examples, *, seq_len: int) -> Counter:
    """Independent expectation: every trained token at position 1..S-1 (position 0 has no y)."""
    return Counter(
        t
        for ids, mask in examples
        for p, (t, m) in enumerate(zip(ids, mask))
        if m and 0 < p < seq_len
    )


def delivered_targets(batches) -> Counter:
    return Counter(int(t) for b in batches for t in b["y"][b["y"] != IGNORE_INDEX])


def _epoch(dst: Path, epoch: int, **options: object) -> list[dict[str, torch.Tensor]]:
    """Epoch ``epoch`` of a fresh loader (batch_size 4, seed 5 unless given)."""
    loader = ParquetLoader(dst, **{"batch_size": 4, "seed": 5, **options})  # type: ignore[arg-type]
    loader.set_epoch(epoch)
    return list(loader)


@pytest.mark.parametrize(("window", "workers"), [(None, 0), (2, 0), (2, 2)])
def test_conservation_every_trained_token_once_per_epoch(
    dst: Path, window: int | None, workers: int
) -> None:
    # Fixture lengths are 2..16 = S, so nothing is cut; ids are unique per (row, position).
    loader = ParquetLoader(
        dst, batch_size=8, drop_last=False, sampler=SamplerOptions(shuffle_window=window),
        num_workers=workers, seed=3,
    )
    assert loader.seq_len == 16 and loader.pad_id == 0
    batches = list(loader)
    assert len(batches) == len(loader.sampler.batches(0)) == 7  # ceil(50 / 8)
    assert delivered_targets(batches) == trained_targets(random_examples(50, seed=1), seq_len=16)
    for b in batches:
        assert b["x"].dtype == torch.int64 and b["y"].dtype == torch.int64
        assert b["loss_mask"].dtype == torch.bool and b["attention_mask"].dtype == torch.bool
        assert b["x"].shape[1] == 15
        assert torch.equal(b["loss_mask"], b["y"] != IGNORE_INDEX)


def test_conservation_accounts_for_truncation(tmp_path: Path) -> None:
    examples = random_examples(30, seed=9, max_len=40)
    # S=40: a run never writes a row longer than its S (readers refuse such a manifest)
    root = write_dst(tmp_path / "long", {"train": examples}, rows_per_group=8, manifest={"seq_len": 40})
    with pytest.warns(UserWarning, match="below the S=40 that `etl run` used"):
        loader = ParquetLoader(root, batch_size=4, seq_len=12, drop_last=False)  # right truncation
    assert delivered_targets(list(loader)) == trained_targets(examples, seq_len=12)


def test_workers_and_dynamic_padding(dst: Path) -> None:
    kwargs = {"batch_size": 4, "seed": 1, "sampler": SamplerOptions(shuffle_window=2),
              "collate": PadOptions("longest", pad_multiple=4), "drop_last": False}
    solo = list(ParquetLoader(dst, num_workers=0, **kwargs))
    # The worker-aware batch order depends on num_workers; compare as sets of batches.
    duo = list(ParquetLoader(dst, num_workers=2, **kwargs))
    key = lambda b: tuple(b["x"].flatten().tolist())
    assert sorted(map(key, solo)) == sorted(map(key, duo))
    # Dynamic padding loses no target (lengths <= S) and T = ceil((longest - 1) / 4) * 4 <= 15.
    examples = random_examples(50, seed=1)
    assert delivered_targets(solo) == trained_targets(examples, seq_len=16)
    for b in solo:
        longest = max(len(examples[row][0]) for row in (b["x"][:, 0] // 1000).tolist())
        assert b["x"].shape[1] == min(-(-(longest - 1) // 4) * 4, 15)


def test_epochs_advance_and_set_epoch_replays(dst: Path) -> None:
    loader = ParquetLoader(dst, batch_size=10, seed=2, split="train")
    e0, e1 = list(loader), list(loader)
    assert loader.epoch == 2
    assert [b["x"].tolist() for b in e0] != [b["x"].tolist() for b in e1]
    loader.set_epoch(0)
    assert [b["x"].tolist() for b in loader] == [b["x"].tolist() for b in e0]


def test_state_saved_after_an_epochs_last_batch_resumes_at_the_next_epoch(dst: Path) -> None:
    loader = ParquetLoader(dst, batch_size=10, seed=2)
    e0 = []
    for batch in loader:  # a training loop that checkpoints after every step
        e0.append(batch["x"].tolist())
        state = loader.state_dict()
    e1 = [b["x"].tolist() for b in loader]
    resumed = ParquetLoader(dst, batch_size=10, seed=2)
    resumed.load_state_dict(state)  # saved after epoch 0's last batch
    assert resumed.epoch == 1 and [b["x"].tolist() for b in resumed] == e1 != e0


def test_collate_is_the_function_not_its_module() -> None:
    import etl.loader.collate  # noqa: F401 (importing the submodule must not shadow the name)
    from etl.loader import collate

    assert callable(collate) and collate is sys.modules["etl.loader.collate"].collate


def test_the_packages_export_a_training_loops_names_and_import_no_torch() -> None:
    """etl.loader's names are a loop's (at most 25; the rest stay in their modules), etl.train's the
    scoring helpers; neither import pulls in torch until a name is used."""
    import etl.loader
    import etl.train

    assert len(etl.loader.__all__) <= 25 and not set(etl.loader.__all__) & set(etl.train.__all__)
    assert all(callable(getattr(etl.train, name)) for name in etl.train.__all__)
    code = "import sys, etl.loader, etl.train; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_break_mid_epoch_then_resume_delivers_each_batch_once(dst: Path) -> None:
    full = [b["x"].tolist() for b in ParquetLoader(dst, batch_size=4, seed=5, num_workers=2)]
    loader = ParquetLoader(dst, batch_size=4, seed=5, num_workers=2)
    head = []
    for b in loader:  # workers prefetch beyond the break; those batches must not be lost
        head.append(b["x"].tolist())
        if len(head) == 3:
            break
    state = loader.state_dict()
    assert state["position"] == 3
    loader.load_state_dict(state)  # a new `for` starts a new epoch unless a state was just loaded
    assert head + [b["x"].tolist() for b in loader] == full
    it = iter(loader)  # the same iterator, kept, also continues where it stopped
    first = [next(it)["x"].tolist() for _ in range(2)]
    assert first + [b["x"].tolist() for b in it] == [b["x"].tolist() for b in _epoch(dst, 1, num_workers=2)]


def test_resume_in_a_new_process_equals_an_uninterrupted_run(dst: Path, tmp_path: Path) -> None:
    sys.path.insert(0, str(HERE))
    from resume_script import LOADER_ARGS  # the same settings in every process

    sys.path.pop(0)
    loader = ParquetLoader(dst, **LOADER_ARGS)
    full = [{k: v.tolist() for k, v in b.items()} for b in list(loader) + list(loader)]
    script, k = str(HERE / "resume_script.py"), 5
    state, first, rest = tmp_path / "state.json", tmp_path / "first.json", tmp_path / "rest.json"
    subprocess.run(
        [sys.executable, script, "first", str(dst), str(k), str(state), str(first)], check=True
    )
    subprocess.run([sys.executable, script, "rest", str(dst), str(state), str(rest)], check=True)
    assert json.loads(state.read_text())["position"] == k
    assert json.loads(first.read_text()) == full[:k]
    assert json.loads(rest.read_text()) == full[k:]


def test_options_random_sampler_float_mask_and_cpu_fallback(dst: Path) -> None:
    loader = ParquetLoader(
        dst,
        batch_size=6,
        sampler=SamplerOptions("random", num_batches=3),
        collate=PadOptions(mask_dtype="float32", use_loss_mask=True),
        seed=4,
    )
    batches = list(loader)
    assert len(batches) == 3 and all(b["loss_mask"].dtype == torch.float32 for b in batches)
    if not torch.cuda.is_available():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cpu = ParquetLoader(dst, batch_size=6, device="cuda")
        assert cpu.device.type == "cpu" and "CUDA is not available" in str(caught[0].message)
        assert next(iter(cpu))["x"].device.type == "cpu"


def test_loader_errors(dst: Path, tmp_path: Path) -> None:
    with pytest.raises(EtlError, match="unknown sampler"):
        ParquetLoader(dst, batch_size=4, sampler="bogus")  # type: ignore[arg-type]
    root = write_dst(
        tmp_path / "nopad",
        {"train": random_examples(4, seed=0)},
        manifest={"pad_id": None, "eot_id": None},
    )
    with pytest.raises(EtlError, match="no pad id"):
        ParquetLoader(root, batch_size=2)
    pad = PadOptions(pad_id=3)
    assert ParquetLoader(root, batch_size=2, collate=pad).pad_id == 3
    with pytest.raises(EtlError, match="cannot fill one batch"):
        ParquetLoader(root, batch_size=8, collate=pad)
    assert len(ParquetLoader(root, batch_size=3, drop_last=False, collate=pad)) == 2


@pytest.mark.parametrize("seq_len", [1, 0, -5])
def test_a_seq_len_below_two_says_what_is_wrong_and_what_is_allowed(dst: Path, seq_len: int) -> None:
    with pytest.raises(EtlError) as err:
        ParquetLoader(dst, batch_size=4, seq_len=seq_len)
    message = str(err.value)
    assert f"seq_len={seq_len} is too small" in message and "T = S - 1" in message
    assert "an integer of 2 or more" in message and "leave it out to use the S of `etl run` (16)" in message
    with pytest.warns(UserWarning, match="below the S=16"):  # 2 is allowed, if cut token-wise
        assert ParquetLoader(dst, batch_size=4, seq_len=2).seq_len == 2


def test_a_manifest_without_seq_len_asks_for_one(tmp_path: Path) -> None:
    root = write_dst(tmp_path / "noseq", {"train": random_examples(4, seed=0)}, manifest={"seq_len": None})
    with pytest.raises(EtlError, match=r"manifest has no seq_len; pass seq_len=S: .* 2 or more"):
        ParquetLoader(root, batch_size=2)
    assert ParquetLoader(root, batch_size=2, seq_len=8).seq_len == 8
