"""ParquetLoader's rough edges: `collate="longest"` pads as TRL does, wrong keyword types and
forged resume states are refused with one error that names what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from etl.errors import EtlError
from etl.loader import PadOptions, ParquetLoader

from .conftest import random_examples, write_dst

S = 16


@pytest.fixture(scope="module")
def dst(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dst(tmp_path_factory.mktemp("edges") / "dst", {"train": random_examples(30, seed=3)},
                     manifest={"seq_len": S})


def _lengths(dst: Path, batch: dict[str, torch.Tensor], examples: list) -> list[int]:
    """Each row's example length, found by its first id (row r holds 1000 * r + position)."""
    return [len(examples[r][0]) for r in (batch["x"][:, 0] // 1000).tolist()]


def test_longest_pads_to_exactly_the_longest_as_trls_collator(dst: Path) -> None:
    trl_utils = pytest.importorskip("trl.trainer.sft_trainer")
    examples = random_examples(30, seed=3)
    for batch in ParquetLoader(dst, batch_size=4, seed=0, collate="longest"):
        lengths = _lengths(dst, batch, examples)
        rows = [{"input_ids": examples[r][0]} for r in (batch["x"][:, 0] // 1000).tolist()]
        theirs = trl_utils.DataCollatorForLanguageModeling(pad_token_id=0)(rows)["input_ids"]
        # TRL pads input_ids to the longest example; etl's x is those ids less the last column.
        assert batch["x"].shape[1] == theirs.shape[1] - 1 == max(lengths) - 1
        assert torch.equal(batch["x"], theirs[:, :-1])
        assert batch["attention_mask"].sum(1).tolist() == [min(n, max(lengths) - 1) for n in lengths]
    for batch in ParquetLoader(dst, batch_size=4, seed=0, collate=PadOptions("longest", pad_multiple=8)):
        longest = max(_lengths(dst, batch, examples))
        assert batch["x"].shape[1] == min(-(-(longest - 1) // 8) * 8, S - 1)  # rounded up, capped at S - 1


@pytest.mark.parametrize(("keywords", "message"), [
    ({"batch_size": "32"}, r"ParquetLoader\(batch_size=...\) must be an integer >= 1, got '32' \(str\) \(pass batch_size=32\)"),
    ({"batch_size": 2.0}, r"batch_size=...\) must be an integer >= 1, got 2.0 \(float\)"),
    ({"batch_size": True}, r"batch_size=...\) must be an integer >= 1, got True \(bool\)"),
    ({"seq_len": 2.5}, r"seq_len=...\) must be an integer \(S\), or None for the run's S, got 2.5 \(float\)"),
    ({"seed": "0"}, r"seed=...\) must be an integer >= 0, got '0'"),
    ({"seed": -1}, r"seed=...\) must be an integer >= 0, got -1"),
    ({"shuffle": "no"}, r"shuffle=...\) must be True or False, got 'no'"),
    ({"drop_last": None}, r"drop_last=...\) must be True or False, got None"),
    ({"num_workers": "2"}, r"num_workers=...\) must be an integer >= 0"),
    ({"rank": 0, "world_size": "2"}, r"world_size=...\) must be an integer >= 1, or None, got '2'"),
    ({"split": ["train"]}, r"split=...\) must be a split name such as 'train' or 'val', got \['train'\] \(list\)"),
    ({"packing": "nonsense"}, r"unknown packing 'nonsense'; choose one of \['bfd', 'ffd', 'sequential', 'stream'\]"),
    ({"collate": ["longest"]}, r"collate= takes 'fixed', 'longest' or PadOptions\(...\), got \['longest'\]"),
    ({"domains": "chat"}, r"domain weights must be a non-empty dict of domain -> weight, got 'chat'"),
])
def test_a_wrong_keyword_raises_one_error_naming_it(dst: Path, keywords: dict, message: str) -> None:
    with pytest.raises(EtlError, match=message):
        ParquetLoader(dst, **{"batch_size": 4, **keywords})


def test_numpy_integers_are_integers(dst: Path) -> None:
    np = pytest.importorskip("numpy")
    loader = ParquetLoader(dst, batch_size=np.int64(4), seed=np.int32(1), seq_len=np.int64(S))
    assert next(iter(loader))["x"].shape == (4, S - 1)


def _saved(dst: Path, **options: object) -> dict:
    loader = ParquetLoader(dst, **{"batch_size": 4, "seed": 0, **options})  # type: ignore[arg-type]
    iterator = iter(loader)
    next(iterator), next(iterator)
    return loader.state_dict()


@pytest.mark.parametrize(("edit", "message"), [
    ({"position": -1}, r"position must be an integer >= 0, got -1"),
    ({"position": 8}, r"position 8 is past the 7 batches of epoch 0"),
    ({"position": "2"}, r"position must be an integer >= 0, got '2'"),
    ({"position": 2.0}, r"position must be an integer >= 0, got 2.0"),
    ({"position": True}, r"position must be an integer >= 0, got True"),
    ({"epoch": -3}, r"epoch must be an integer >= 0, got -3"),
    ({"epoch": None}, r"epoch must be an integer >= 0, got None"),
    ({"seed": 1}, r"sampler settings differ \(seed: now 0, saved 1\)"),
])
def test_a_forged_state_is_refused(dst: Path, edit: dict, message: str) -> None:
    state = _saved(dst) | edit
    loader = ParquetLoader(dst, batch_size=4, seed=0)
    with pytest.raises(EtlError, match=message):
        loader.load_state_dict(state)
    loader.load_state_dict(_saved(dst) | {"position": 7})  # after the epoch's last batch: allowed
    assert (loader.epoch, loader.position) == (1, 0)


def test_another_runs_state_and_a_non_dict_are_refused(dst: Path, tmp_path: Path) -> None:
    other = write_dst(tmp_path / "other", {"train": random_examples(30, seed=4)}, manifest={"seq_len": S})
    loader = ParquetLoader(dst, batch_size=4, seed=0)
    with pytest.raises(EtlError, match="cannot resume: the state was saved on other data"):
        loader.load_state_dict(_saved(other))
    with pytest.raises(EtlError, match="sampler settings differ"):
        loader.load_state_dict(_saved(dst, seed=7))  # same data, another run's seed
    with pytest.raises(EtlError, match="cannot resume from a list: pass the dict loader.state_dict"):
        loader.load_state_dict([("epoch", 0)])  # type: ignore[arg-type]
    packed = ParquetLoader(dst, batch_size=2, seed=0, packing="bfd")
    with pytest.raises(EtlError, match="position 99 is past"):  # the packed sampler checks it too
        packed.load_state_dict(_saved(dst, batch_size=2, packing="bfd") | {"position": 99})
