"""ParquetLoader(domains=...): exact shares per epoch, resume, determinism, packing, errors;
hypothesis properties of the pure functions in `etl.loader.domain_mix`."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.errors import EtlError, EtlWarning
from etl.loader.dataloader import ParquetLoader
from etl.loader.dataset import ParquetDataset
from etl.loader.domain_mix import (
    domain_slots,
    mixed_order,
    row_probabilities,
    take_turns,
    weighted_epoch_rows,
    weighted_random_rows,
)
from etl.loader.groups import PadOptions, SamplerOptions
from etl.packing.index import build_pack_index
from etl.packing.index_io import write_pack_index
from etl.packing.turn_spans import TurnSpans

from .conftest import random_examples, write_dst
from .test_dataloader import delivered_targets, trained_targets

# 100 rows: "a" (every 10th row, 10 rows) is upsampled to 67 examples an epoch, "b" (90 rows)
# downsampled to 33; rows of both sit in every row group.
DOMAIN_OF = np.where(np.arange(100) % 10 == 3, "a", "b")
WEIGHTS = {"a": 2.0, "b": 1.0}

weight_lists = st.lists(st.one_of(st.just(0.0), st.floats(1e-3, 1e3)), min_size=1, max_size=6).filter(
    lambda w: sum(w) > 0
)


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    return write_dst(tmp_path / "mixed", {"train": random_examples(100, seed=7)}, rows_per_group=8,
                     rows_per_file=30, domains={"train": DOMAIN_OF.tolist()})


def _rows(batches) -> list[int]:
    """Dataset row of every example delivered (ids are 1000 * row + position, none is empty)."""
    return [int(t) // 1000 for b in batches for t in b["x"][:, 0]]


def _x(batches) -> list[list[list[int]]]:
    return [b["x"].tolist() for b in batches]


@pytest.mark.parametrize("extra", [{}, {"sampler": SamplerOptions(shuffle_window=None)}, {"num_workers": 2},
                                   {"balance": True}])
def test_an_epoch_delivers_the_weighted_shares(mixed: Path, extra: dict) -> None:
    loader = ParquetLoader(mixed, batch_size=4, drop_last=False, domains=WEIGHTS, **extra)
    rows = _rows(loader)
    assert len(rows) == len(loader.dataset) == 100  # an unweighted epoch's size
    assert Counter(DOMAIN_OF[rows]) == {"a": 67, "b": 33}  # 2/3 and 1/3 of 100, rounded
    per_row = Counter(rows)
    assert {per_row[r] for r in np.flatnonzero(DOMAIN_OF == "a")} == {6, 7}  # 67 / 10 rows
    assert all(per_row[r] == 1 for r in per_row if DOMAIN_OF[r] == "b")  # a subset of 33


def test_ranks_split_the_weighted_epoch(mixed: Path) -> None:
    ranks = [ParquetLoader(mixed, batch_size=4, drop_last=False, rank=r, world_size=2, seed=1,
                           domains=WEIGHTS) for r in range(2)]
    rows = _rows(ranks[0]) + _rows(ranks[1])
    assert len(ranks[0]) == len(ranks[1]) and len(rows) == 100
    assert Counter(DOMAIN_OF[rows]) == {"a": 67, "b": 33}


def test_unnamed_domains_are_left_out(mixed: Path) -> None:
    rows = _rows(ParquetLoader(mixed, batch_size=4, drop_last=False, domains={"b": 1}))
    assert set(DOMAIN_OF[rows]) == {"b"} and len(rows) == 100
    assert set(Counter(rows).values()) == {1, 2}  # 100 examples from 90 rows


def test_random_sampler_draws_by_the_weights(mixed: Path) -> None:
    loader = ParquetLoader(mixed, batch_size=4, sampler=SamplerOptions("random", num_batches=2500), domains=WEIGHTS)
    drawn = np.concatenate(loader.sampler.batches(0))  # 10k draws: the share's sd is ~0.005
    assert abs(np.mean(DOMAIN_OF[drawn] == "a") - 2 / 3) < 0.02
    few = ParquetLoader(mixed, batch_size=4, sampler=SamplerOptions("random", num_batches=5), domains=WEIGHTS)
    assert _rows(few) == np.concatenate(few.sampler.batches(0)).tolist()
    p = row_probabilities((DOMAIN_OF == "b").astype(np.int64), np.array([2.0, 1.0]))
    assert np.isclose(p.sum(), 1) and np.allclose(p[DOMAIN_OF == "a"], 2 / 3 / 10)
    only_b = ParquetLoader(mixed, batch_size=4, sampler="random", domains={"a": 0, "b": 1})
    assert set(DOMAIN_OF[np.concatenate(only_b.sampler.batches(0))]) == {"b"}


@settings(max_examples=100, deadline=None)
@given(weights=weight_lists, seed=st.integers(0, 2**31), world=st.integers(1, 3))
def test_random_rows_draw_weighted_domains_only(weights: list[float], seed: int, world: int) -> None:
    codes = np.arange(30) % len(weights)
    every = weighted_random_rows(codes, np.array(weights), seed=seed, epoch=1, num_batches=40,
                                 batch_size=5, rank=None, world_size=world)
    assert every.shape == (40, 5 * world) and set(codes[every.ravel()]) <= set(np.flatnonzero(weights))
    mine = weighted_random_rows(codes, np.array(weights), seed=seed, epoch=1, num_batches=40,
                                batch_size=5, rank=world - 1, world_size=world)
    assert np.array_equal(mine, every.reshape(40, world, 5)[:, world - 1])


@pytest.mark.parametrize("extra", [{}, {"packing": "bfd"}, {"sampler": SamplerOptions("random", num_batches=20)},
                                   {"balance": True, "rank": 1, "world_size": 2}])
def test_resume_mid_epoch_gives_the_same_remaining_batches(mixed: Path, extra: dict) -> None:
    args = {"batch_size": 4, "seed": 3, "domains": WEIGHTS, **extra}
    whole = ParquetLoader(mixed, **args)
    epoch0, epoch1 = _x(whole), _x(whole)
    first = ParquetLoader(mixed, **args)
    head = _x(itertools.islice(iter(first), 3))
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
    resumed = ParquetLoader(mixed, **args)
    resumed.load_state_dict(state)
    assert head + _x(resumed) == epoch0
    assert _x(resumed) == epoch1 != epoch0
    with pytest.raises(EtlError, match="domain_weights"):
        ParquetLoader(mixed, **{**args, "domains": {"a": 1, "b": 1}}).load_state_dict(state)
    with pytest.raises(EtlError, match="domain_weights"):
        ParquetLoader(mixed, **{**args, "domains": None}).load_state_dict(state)


def test_deterministic_per_seed_and_new_every_epoch(mixed: Path) -> None:
    def two_epochs(seed: int) -> tuple[list, list]:
        loader = ParquetLoader(mixed, batch_size=4, seed=seed, domains=WEIGHTS)
        return _x(loader), _x(loader)

    e0, e1 = two_epochs(5)
    assert (e0, e1) == two_epochs(5)
    assert e0 != e1 and e0 != two_epochs(6)[0]
    subset = [{r for r in _rows_of(e) if DOMAIN_OF[r] == "b"} for e in (e0, e1)]
    assert subset[0] != subset[1]  # epoch 1 downsamples "b" to other rows


def _rows_of(xs: list[list[list[int]]]) -> list[int]:
    return [row[0] // 1000 for batch in xs for row in batch]


def test_shuffle_false_delivers_the_epoch_in_file_order(mixed: Path) -> None:
    rows = _rows(ParquetLoader(mixed, batch_size=4, shuffle=False, domains=WEIGHTS))
    assert rows == sorted(rows) and Counter(DOMAIN_OF[rows]) == {"a": 67, "b": 33}


def test_packing_packs_the_weighted_rows(mixed: Path) -> None:
    loader = ParquetLoader(mixed, batch_size=2, packing="bfd", drop_last=False, seed=2,
                           domains=WEIGHTS)
    rows = loader.sampler.doc_rows_of(0)[np.unique(loader.sampler.packing(0).doc)]  # with copies
    examples = random_examples(100, seed=7)
    batches = list(loader)
    assert delivered_targets(batches) == trained_targets([examples[r] for r in rows], seq_len=16)
    starts = []  # first x token of every segment: 1000 * its row (bfd keeps examples whole)
    for b in batches:
        seg = b["segment_ids"]
        first = seg.clone().bool()
        first[:, 1:] &= seg[:, 1:] != seg[:, :-1]
        starts += b["x"][first].tolist()
    # Two copies of one example side by side in a pack are two segments, not one.
    assert all(t % 1000 == 0 for t in starts)
    assert Counter(DOMAIN_OF[[t // 1000 for t in starts]]) == {"a": 67, "b": 33}


def test_a_pack_index_gives_way_to_online_packing(mixed: Path) -> None:
    write_pack_index(mixed, {"train": build_pack_index(mixed, "train", strategy="bfd", seq_len=16, seed=0)})
    with pytest.warns(EtlWarning, match="pack index .* not used"):
        loader = ParquetLoader(mixed, batch_size=2, packing="bfd", domains=WEIGHTS)
    assert loader.sampler.index is None and len(loader.sampler.packing(0).doc) == 100


def test_stream_packing_of_an_etl_run_with_a_domain_key(tmp_path: Path) -> None:
    from etl.cli import main

    src, cfg = tmp_path / "raw.jsonl", tmp_path / "cfg.json"
    records = [{"messages": [{"role": "user", "content": f"question {i}"},
                             {"role": "assistant", "content": f"answer {i} " * (i % 7 + 1)}],
                "source": "math" if i % 5 == 0 else "chat"} for i in range(40)]
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg.write_text(json.dumps({"input": {"domain_key": "source"}}))
    dst = tmp_path / "out"
    assert main(["run", str(src), str(dst), "--config", str(cfg), "--template", "post_training",
                 "--quiet"]) == 0
    dataset = ParquetDataset(dst)
    codes, names = dataset.domain_codes()
    assert Counter(names[c] for c in codes) == {"math": 8, "chat": 32}
    loader = ParquetLoader(dst, batch_size=2, seq_len=48, packing="stream", drop_last=False,
                           domains={"math": 1, "chat": 1})
    # Docs number the epoch's 40 examples (copies apart); a doc's pieces may span packs.
    docs = np.unique(loader.sampler.packing(0).doc)
    rows = np.searchsorted(dataset.global_rows(), loader.sampler.doc_rows_of(0)[docs])
    assert len(docs) == 40 and Counter(names[c] for c in codes[rows]) == {"math": 20, "chat": 20}
    assert sum(int(b["loss_mask"].sum()) for b in loader) > 0


def test_errors_name_the_domains_and_the_rule(mixed: Path) -> None:
    with pytest.raises(EtlError, match=r"\['c'\].*domains present: \['a', 'b'\]"):
        ParquetLoader(mixed, batch_size=4, domains={"a": 1, "c": 1})
    for bad in ({"a": -1.0}, {"a": float("nan")}, {"a": float("inf")}, {"a": 0, "b": 0}, {"a": "x"}):
        with pytest.raises(EtlError, match="domain weights must be"):
            ParquetLoader(mixed, batch_size=4, domains=bad)
    for bad in ({}, [("a", 1.0)]):
        with pytest.raises(EtlError, match="non-empty dict"):
            ParquetLoader(mixed, batch_size=4, domains=bad)


def test_domains_follow_min_tokens_and_nulls_read_as_default(tmp_path: Path) -> None:
    examples = random_examples(6, seed=1, min_len=8) + random_examples(4, seed=2, min_len=2, max_len=3)
    root = write_dst(tmp_path / "d", {"train": examples},
                     domains={"train": ["x", None, "x", "y", None, "x", "z", "z", "z", "z"]})
    codes, names = ParquetDataset(root).domain_codes()
    assert [names[c] for c in codes] == ["x", "__default__", "x", "y", "__default__", "x"] + ["z"] * 4
    codes, names = ParquetDataset(root, min_tokens=5).domain_codes()  # every "z" row is shorter
    assert names == ["x", "__default__", "y"] and len(codes) == 6
    with pytest.raises(EtlError, match=r"\['z'\]"):
        ParquetLoader(root, batch_size=2, collate=PadOptions(min_tokens=5), domains={"x": 1, "z": 1})


# Pure functions.

@settings(max_examples=200, deadline=None)
@given(weights=weight_lists, num_rows=st.integers(0, 500))
def test_slots_sum_to_n_and_round_each_quota(weights: list[float], num_rows: int) -> None:
    slots = domain_slots(np.array(weights), num_rows=num_rows)
    quota = np.array(weights) / sum(weights) * num_rows
    assert slots.sum() == num_rows and np.all(np.abs(slots - quota) < 1 + 1e-9)
    assert np.all(slots[np.array(weights) == 0] == 0)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), weights=weight_lists, seed=st.integers(0, 2**31))
def test_epoch_rows_repeat_each_row_floor_or_ceil_times(data: st.DataObject, weights: list[float], seed: int) -> None:
    sizes = data.draw(st.lists(st.integers(1, 30), min_size=len(weights), max_size=len(weights)))
    codes = data.draw(st.permutations(np.repeat(np.arange(len(sizes)), sizes).tolist()))
    codes = np.array(codes, dtype=np.int64)
    n = data.draw(st.integers(0, 3 * len(codes)))
    rows = weighted_epoch_rows(codes, np.array(weights), num_rows=n, seed=seed)
    assert rows.shape == (n,) and np.array_equal(rows, weighted_epoch_rows(codes, np.array(weights), num_rows=n, seed=seed))
    slots = domain_slots(np.array(weights), num_rows=n)
    assert np.array_equal(np.bincount(codes[rows], minlength=len(sizes)), slots)
    times = np.bincount(rows, minlength=len(codes))
    for d, (size, slot) in enumerate(zip(sizes, slots, strict=True)):
        assert set(times[codes == d]) <= {slot // size, -(-slot // size)}


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.integers(0, 40), max_size=80), seed=st.integers(0, 1000), blocks=st.integers(0, 5))
def test_mixed_order_reorders_the_rows_it_is_given(rows: list[int], seed: int, blocks: int) -> None:
    rows_ = np.array(rows, dtype=np.int64)
    shuffled = mixed_order(rows_, seed=seed, epoch=1, blocks=blocks, mix=2)
    assert sorted(shuffled.tolist()) == sorted(rows) == mixed_order(rows_, seed=seed, epoch=1, shuffle=False).tolist()
    labels = np.arange(41) // 3
    assert sorted(mixed_order(rows_, seed=seed, epoch=1, blocks=labels).tolist()) == sorted(rows)


def test_take_turns_keeps_every_copy_and_equals_take_docs_on_a_permutation() -> None:
    doc = np.array([0, 0, 1, 2, 2, 2])
    turns = TurnSpans(doc, np.array([0, 3, 0, 0, 2, 5]), np.array([3, 6, 4, 2, 5, 9]),
                      np.array([1, 2, 3, 2, 3, 3], dtype=np.int8), np.ones(6, dtype=np.int64))
    perm = np.array([2, 0, 1])
    a, b = take_turns(turns, perm), turns.take_docs(perm)
    assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("doc", "start", "end", "role", "header_len"))
    twice = take_turns(turns, np.array([2, 1, 2]))
    assert twice.doc.tolist() == [0, 0, 0, 1, 2, 2, 2] and twice.start.tolist() == [0, 2, 5, 0, 0, 2, 5]
