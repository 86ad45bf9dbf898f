"""ParquetLoader(balance=True): simulated ranks get the same rows, nearly equal tokens, resume."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from etl.errors import EtlError
from etl.loader.balance import TokenBalance, imbalance
from etl.loader.dataloader import ParquetLoader
from etl.loader.groups import PackOptions, SamplerOptions

from .conftest import write_dst
from .test_dataloader import delivered_targets, trained_targets

WORLD, S = 4, 64


def skewed_examples(n: int, *, seed: int) -> list[tuple[list[int], list[bool]]]:
    """Row r holds ids 1000 * r + position; lengths mostly short with a long tail cut at S + 8."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(np.ceil(rng.lognormal(2.0, 1.0, n)), S + 8).astype(int) + 2
    return [([1000 * r + p for p in range(k)], [p > 0 for p in range(k)]) for r, k in enumerate(lengths)]


@pytest.fixture
def skewed(tmp_path: Path) -> Path:
    """200 train rows, S = 64, row groups of 16."""
    return write_dst(tmp_path / "skewed", {"train": skewed_examples(200, seed=0)}, rows_per_group=16,
                     manifest={"seq_len": S})


def ranks(dst: Path, **options: object) -> list[list[dict[str, torch.Tensor]]]:
    """One epoch on each of WORLD simulated ranks."""
    return [list(ParquetLoader(dst, rank=r, world_size=WORLD, **options)) for r in range(WORLD)]


def step_rows(per_rank: list[list[dict[str, torch.Tensor]]]) -> list[list[int]]:
    """The rows of every global step, over all ranks (row = first token // 1000)."""
    return [sorted((torch.cat([r[s]["x"][:, 0] for r in per_rank]) // 1000).tolist())
            for s in range(len(per_rank[0]))]


def step_imbalance(per_rank: list[list[dict[str, torch.Tensor]]]) -> np.ndarray:
    """max / min real tokens (attention_mask) over ranks, for every step."""
    tokens = [[int(b["attention_mask"].sum()) for b in r] for r in per_rank]
    return imbalance(np.array(tokens).T)


@pytest.mark.parametrize("drop_last", [True, False])
def test_padded_ranks_get_the_same_rows_with_more_even_tokens(skewed: Path, drop_last: bool) -> None:
    common = {"batch_size": 4, "seed": 3, "drop_last": drop_last}
    plain, dealt = ranks(skewed, **common), ranks(skewed, balance=TokenBalance(window=1), **common)
    assert step_rows(dealt) == step_rows(plain)  # every step keeps its rows; only ranks change
    assert [[b["x"].shape for b in r] for r in dealt] == [[b["x"].shape for b in r] for r in plain]
    before, after = step_imbalance(plain), step_imbalance(dealt)
    assert after.mean() < 1.25 and before.mean() > 1.5
    if not drop_last:  # the whole epoch, each trained token once
        batches = list(itertools.chain.from_iterable(dealt))
        assert delivered_targets(batches) == trained_targets(skewed_examples(200, seed=0), seq_len=S)


def test_window_moves_rows_between_steps_only_inside_the_window(skewed: Path) -> None:
    common = {"batch_size": 4, "seed": 3}
    plain = step_rows(ranks(skewed, **common))
    pooled = ranks(skewed, balance=TokenBalance(window=4), **common)
    rows = step_rows(pooled)
    for first in range(0, len(rows), 4):
        window = [np.concatenate(steps[first : first + 4]) for steps in (rows, plain)]
        assert sorted(window[0]) == sorted(window[1])
    per_step = ranks(skewed, balance=TokenBalance(window=1), **common)
    assert step_imbalance(pooled).mean() < step_imbalance(per_step).mean()


def test_balancing_regroups_eight_steps_by_default(skewed: Path) -> None:
    common = {"batch_size": 4, "seed": 3}
    default = step_rows(ranks(skewed, balance=True, **common))
    assert default == step_rows(ranks(skewed, balance=TokenBalance(window=8), **common))
    assert default != step_rows(ranks(skewed, balance=TokenBalance(window=1), **common))


def test_packed_ranks_share_the_packs_with_even_tokens(skewed: Path) -> None:
    # At most 2 examples a pack: many packs are short, so ranks differ without balancing.
    common = {"batch_size": 2, "seed": 1, "packing": PackOptions("bfd", max_docs_per_bin=2), "drop_last": False}
    plain, dealt = ranks(skewed, **common), ranks(skewed, balance=True, **common)
    assert delivered_targets(list(itertools.chain.from_iterable(dealt))) == delivered_targets(
        list(itertools.chain.from_iterable(plain))
    )
    assert step_imbalance(dealt).mean() < 0.75 * step_imbalance(plain).mean()
    assert [len(r) for r in dealt] == [len(r) for r in plain]


@pytest.mark.parametrize("packing", [None, "bfd"])
def test_resume_mid_epoch_gives_the_same_remaining_batches(skewed: Path, packing: str | None) -> None:
    args = {"batch_size": 3, "seed": 2, "rank": 1, "world_size": 2, "packing": packing,
            "balance": TokenBalance(window=3)}
    full = [b["x"].tolist() for b in ParquetLoader(skewed, **args)]
    first = ParquetLoader(skewed, **args)
    taken = [b["x"].tolist() for b in itertools.islice(iter(first), 4)]
    resumed = ParquetLoader(skewed, **args)
    resumed.load_state_dict(first.state_dict())
    assert taken + [b["x"].tolist() for b in resumed] == full
    for other in ({"balance": None}, {"balance": TokenBalance(window=2)},
                  {"balance": TokenBalance("snake", window=3)}):
        with pytest.raises(EtlError, match="balance_tokens"):
            ParquetLoader(skewed, **{**args, **other}).load_state_dict(first.state_dict())


def test_random_sampler_balances_its_draws(skewed: Path) -> None:
    common = {"batch_size": 4, "seed": 5, "sampler": SamplerOptions("random", num_batches=10)}
    plain, dealt = ranks(skewed, **common), ranks(skewed, balance=TokenBalance("greedy", window=1), **common)
    assert step_rows(dealt) == step_rows(plain)
    assert step_imbalance(dealt).mean() < step_imbalance(plain).mean()


def test_options_are_checked(skewed: Path) -> None:
    with pytest.raises(EtlError, match="choose one of"):
        ParquetLoader(skewed, batch_size=4, balance="lpt")
    with pytest.raises(EtlError, match=r"TokenBalance\(window=...\) must be an integer >= 1"):
        TokenBalance(window=0)
    with pytest.raises(EtlError, match="balance= takes True, a dealer name or TokenBalance"):
        ParquetLoader(skewed, batch_size=4, balance=8)
