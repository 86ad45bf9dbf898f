"""ParquetLoader(packing=...): packs of whole examples lose no trained token, resume, shard, index."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from etl.columns import IGNORE_INDEX
from etl.errors import EtlError, EtlWarning
from etl.loader.dataloader import ParquetLoader
from etl.loader.groups import CacheOptions, PackOptions, PadOptions
from etl.packing.index import build_pack_index
from etl.packing.index_io import write_pack_index

from .conftest import random_examples, write_dst
from .test_dataloader import delivered_targets, trained_targets


def _segments_in_order(batch: dict[str, torch.Tensor]) -> list[list[int]]:
    """x tokens of each segment of each row (segment ids 1..k, in row order)."""
    out = []
    for x, seg in zip(batch["x"], batch["segment_ids"], strict=True):
        for k in range(1, int(seg.max()) + 1):
            out.append(x[seg == k].tolist())
    return out


@pytest.mark.parametrize("strategy", ["bfd", "ffd"])
def test_every_trained_token_once_per_epoch(dst: Path, strategy: str) -> None:
    # Whole examples (lengths 2..16 = S): every example token after its first is a label once.
    loader = ParquetLoader(dst, batch_size=4, drop_last=False, packing=strategy, seed=5)
    batches = list(loader)
    assert delivered_targets(batches) == trained_targets(random_examples(50, seed=1), seq_len=16)
    for b in batches:
        assert b["x"].shape[1] == 15 and b["y"].shape == b["segment_ids"].shape == b["x"].shape
        assert torch.equal(b["loss_mask"], b["y"] != IGNORE_INDEX)
        seg, pos = b["segment_ids"], b["position_ids"]
        start = torch.ones_like(seg, dtype=torch.bool)
        start[:, 1:] = seg[:, 1:] != seg[:, :-1]
        assert torch.all(pos[start] == 0)  # positions restart at every segment
        assert torch.all(pos[:, 1:][~start[:, 1:]] == pos[:, :-1][~start[:, 1:]] + 1)
    # Each segment's x tokens are a prefix of one example (ids are 1000 * row + position).
    for tokens in itertools.chain.from_iterable(_segments_in_order(b) for b in batches):
        assert tokens == list(range(tokens[0], tokens[0] + len(tokens))) and tokens[0] % 1000 == 0


def test_packs_fill_rows_better_than_padding(dst: Path) -> None:
    padded = list(ParquetLoader(dst, batch_size=4, drop_last=False, seed=5))
    packed = list(ParquetLoader(dst, batch_size=4, drop_last=False, packing="bfd", seed=5))
    assert len(packed) < len(padded)
    assert sum(int(b["attention_mask"].sum()) for b in packed) > 0.8 * sum(b["x"].numel() for b in packed)


def test_epochs_pack_differently_and_deterministically(dst: Path) -> None:
    def first_rows(seed: int) -> list[list[list[int]]]:
        loader = ParquetLoader(dst, batch_size=4, packing="bfd", seed=seed)
        return [[b["x"].tolist() for b in loader] for _ in range(2)]

    a, b = first_rows(1), first_rows(1)
    assert a == b
    assert a[0] != a[1]  # epoch 1 shuffles with seed + 1


def test_resume_mid_epoch_gives_the_same_batches(dst: Path) -> None:
    args = {"batch_size": 3, "packing": "bfd", "seed": 2}
    full = list(ParquetLoader(dst, **args))
    first = ParquetLoader(dst, **args)
    taken = list(itertools.islice(iter(first), 2))
    resumed = ParquetLoader(dst, **args)
    resumed.load_state_dict(first.state_dict())
    rest = list(resumed)
    assert [b["x"].tolist() for b in taken + rest] == [b["x"].tolist() for b in full]
    other = ParquetLoader(dst, **{**args, "packing": "ffd"})
    with pytest.raises(EtlError, match="cannot resume"):
        other.load_state_dict(first.state_dict())


def test_ranks_share_the_packs_of_an_epoch(dst: Path) -> None:
    loaders = [ParquetLoader(dst, batch_size=2, packing="bfd", seed=4, rank=r, world_size=2,
                             drop_last=False) for r in range(2)]
    assert len(loaders[0]) == len(loaders[1])
    got = delivered_targets(list(loaders[0])) + delivered_targets(list(loaders[1]))
    expected = trained_targets(random_examples(50, seed=1), seq_len=16)
    assert set(got) == set(expected) and all(got[t] >= n for t, n in expected.items())


def test_labels_target_is_unshifted_and_keeps_every_token(dst: Path) -> None:
    b_y = next(iter(ParquetLoader(dst, batch_size=4, packing="bfd", seed=1)))
    b_l = next(iter(ParquetLoader(dst, batch_size=4, packing=PackOptions("bfd", target="labels"), seed=1)))
    assert b_l["input_ids"].shape == (4, 16) and torch.equal(b_l["input_ids"][:, :-1], b_y["x"])  # T = S
    # A model that shifts compares logits[:, :-1] with labels[:, 1:]: exactly the targets y has.
    assert torch.equal(b_l["labels"][:, 1:], b_y["y"])
    assert torch.equal(b_l["segment_ids"][:, :-1], b_y["segment_ids"])


def test_uses_the_pack_index_when_it_matches(dst: Path) -> None:
    write_pack_index(dst, {"train": build_pack_index(dst, "train", strategy="ffd", seq_len=16, seed=0)})
    loader = ParquetLoader(dst, batch_size=4, packing="ffd", drop_last=False)
    assert loader.sampler.index is not None
    assert delivered_targets(list(loader)) == trained_targets(random_examples(50, seed=1), seq_len=16)
    with pytest.warns(EtlWarning, match="packing online"):
        online = ParquetLoader(dst, batch_size=4, packing="bfd")
    assert online.sampler.index is None


def test_long_examples_are_clipped_to_s_by_truncation(tmp_path: Path) -> None:
    examples = random_examples(20, seed=3, min_len=20, max_len=30)
    # S=30 as run; the loader packs into 16 (a run never writes a row longer than its S)
    root = write_dst(tmp_path / "long", {"train": examples}, manifest={"seq_len": 30})
    for truncation, first in (("right", 0), ("left", None)):
        with pytest.warns(UserWarning, match="below the S=30"):
            loader = ParquetLoader(root, batch_size=2, seq_len=16, packing=PackOptions("bfd", truncation=truncation))
        batch = next(iter(loader))
        assert np.all(batch["segment_ids"].numpy() == 1)  # one clipped example fills each row
        starts = batch["x"][:, 0].numpy() % 1000
        assert np.all(starts == 0) if first == 0 else np.all(starts > 0)


def test_unknown_strategy_names_the_choices(dst: Path) -> None:
    with pytest.raises(EtlError, match="bfd"):
        ParquetLoader(dst, batch_size=4, packing="best")
    with pytest.raises(EtlError, match="use sampler 'epoch' with packing="):
        ParquetLoader(dst, batch_size=4, packing="bfd", sampler="random")
    with pytest.raises(EtlError, match="drop collate="):
        ParquetLoader(dst, batch_size=4, packing="bfd", collate=PadOptions(pad_id=3))
    with pytest.raises(EtlError, match="takes no max_docs_per_bin"):
        PackOptions("sequential", max_docs_per_bin=2)


def test_train_on_eos_off_masks_eos_labels(tmp_path: Path) -> None:
    examples = [([5, 6, 7, 9], [False, True, True, True]), ([5, 8, 9], [False, True, True])]
    root = write_dst(tmp_path / "eos", {"train": examples}, manifest={"eos_ids": [9]})
    on = next(iter(ParquetLoader(root, batch_size=1, packing="bfd", shuffle=False)))
    off = next(iter(ParquetLoader(root, batch_size=1, packing=PackOptions("bfd", train_on_eos=False), shuffle=False)))
    assert Counter(on["y"][on["y"] != IGNORE_INDEX].tolist())[9] == 2
    assert 9 not in off["y"].tolist()


@pytest.mark.filterwarnings("ignore:seq_len=48 is below")  # bfd clips; the others split
@pytest.mark.parametrize("strategy", ["bfd", "sequential", "stream"])
def test_online_packing_equals_the_index_in_file_order(tmp_path: Path, strategy: str) -> None:
    # A real post_training run (turns for stream); S=48 splits the conversations across rows.
    from etl.cli import main

    dst = tmp_path / "pt"
    assert main(["run", str(Path(__file__).parents[2] / "examples" / "raw"), str(dst),
                 "--template", "post_training"]) == 0
    index = build_pack_index(dst, "train", strategy=strategy, seq_len=48)
    args = {"batch_size": 2, "seq_len": 48, "packing": strategy, "shuffle": False, "drop_last": False}
    online = [{k: v.tolist() for k, v in b.items()} for b in ParquetLoader(dst, **args)]
    write_pack_index(dst, {"train": index})
    loader = ParquetLoader(dst, **args)
    assert loader.sampler.index is not None
    assert [{k: v.tolist() for k, v in b.items()} for b in loader] == online
    trained = sum(sum(b["loss_mask"][0]) + sum(b["loss_mask"][-1]) for b in online)
    assert trained > 0


def test_workers_deliver_the_same_packed_batches(dst: Path) -> None:
    # Packs travel to DataLoader workers as PackRequests; each worker reads the split itself.
    args = {"batch_size": 4, "packing": "bfd", "seed": 6, "drop_last": False}
    inline = [b["x"].tolist() for b in ParquetLoader(dst, **args)]
    workers = [b["x"].tolist() for b in ParquetLoader(dst, num_workers=2, **args)]
    assert workers == inline


def test_row_groups_are_read_when_the_split_does_not_fit_the_cache(dst: Path) -> None:
    cached = [b["y"].tolist() for b in ParquetLoader(dst, batch_size=4, packing="bfd", seed=2)]
    small = ParquetLoader(dst, batch_size=4, packing="bfd", seed=2, cache=CacheOptions(mb=0))
    assert [b["y"].tolist() for b in small] == cached
    assert small.dataset._whole is None and small.dataset.row_group_reads > 0
