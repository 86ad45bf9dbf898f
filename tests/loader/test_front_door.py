"""ParquetLoader's front door: plain keywords plus option groups, epochs per `for` as torchdata's
StatefulDataLoader has them, unknown keywords refused with the ones it takes, and the parts
working alone with torch's own DataLoader."""

from __future__ import annotations

import inspect
import itertools
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from etl.errors import EtlError
from etl.loader import (
    CacheOptions,
    DomainWeights,
    PackOptions,
    PadOptions,
    ParquetLoader,
    SamplerOptions,
)

from .conftest import random_examples
from .test_dataloader import delivered_targets, trained_targets


def _x(batches) -> list[list[list[int]]]:
    return [b["x"].tolist() for b in batches]


def test_the_signature_is_a_few_plain_keywords_and_the_groups() -> None:
    params = inspect.signature(ParquetLoader).parameters
    groups = {"packing", "collate", "sampler", "balance", "domains", "cache"}
    plain = [n for n, p in params.items() if n not in groups and p.kind is not p.VAR_KEYWORD]
    assert plain == ["dst", "batch_size", "split", "seq_len", "seed", "shuffle", "drop_last",
                     "num_workers", "device", "rank", "world_size"]
    assert groups <= set(params)


@pytest.mark.parametrize("workers", [0, 2])
def test_peek_then_loop_gives_a_whole_epoch(dst: Path, workers: int) -> None:
    loader = ParquetLoader(dst, batch_size=4, seed=5, drop_last=False, num_workers=workers)
    peek = next(iter(loader))
    assert len(loader) == 13  # ceil(50 / 4): the epoch the next `for` runs
    epoch = list(loader)  # a new iter() is a new epoch, not the rest of the peeked one
    assert len(epoch) == 13 and loader.epoch == 2
    assert delivered_targets(epoch) == trained_targets(random_examples(50, seed=1), seq_len=16)
    fresh = ParquetLoader(dst, batch_size=4, seed=5, drop_last=False, num_workers=workers)
    e0, e1 = list(fresh), list(fresh)
    assert peek["x"].tolist() == e0[0]["x"].tolist() and _x(epoch) == _x(e1)


def test_a_loaded_state_resumes_exactly_the_remaining_batches(dst: Path) -> None:
    args = {"batch_size": 4, "seed": 2, "packing": "bfd", "drop_last": False}
    fresh = ParquetLoader(dst, **args)
    e0, e1 = list(fresh), list(fresh)
    first = ParquetLoader(dst, **args)
    head = list(itertools.islice(iter(first), 5))
    state = first.state_dict()
    first.load_state_dict(state)  # the same loader: the next `for` resumes instead of a new epoch
    assert _x(head + list(first)) == _x(e0) and _x(first) == _x(e1)
    other = ParquetLoader(dst, **args)
    other.load_state_dict(state)
    assert len(other) == len(e0) and _x(list(other)) == _x(e0[5:])


def test_a_replaced_iterator_stops_with_an_error(dst: Path) -> None:
    loader = ParquetLoader(dst, batch_size=4, seed=1)
    old = iter(loader)
    next(old)
    new = iter(loader)
    next(new)
    assert loader.epoch == 1 and loader.position == 1
    with pytest.raises(EtlError, match="replaced by a newer iter"):
        next(old)


def test_an_unknown_keyword_is_named_with_the_ones_it_takes(dst: Path) -> None:
    """A typo, or a keyword of earlier releases (now a field of its option group), fails at once."""
    for wrong in ({"batchsize": 4}, {"pad_multiple": 8}, {"balance_tokens": True}):
        with pytest.raises(TypeError) as caught:
            ParquetLoader(dst, batch_size=4, **wrong)
        message = str(caught.value)
        assert message.startswith(f"ParquetLoader() got an unexpected keyword argument {next(iter(wrong))!r}; "
                                  "it takes dst, batch_size, split,")
        assert "\n" not in message and message.endswith("balance, domains, cache")


@pytest.mark.parametrize(("build", "match"), [
    (lambda: PadOptions(pad_multiple=8), r"pass PadOptions\('longest', pad_multiple=8\)"),
    (lambda: PadOptions("widest"), r"unknown collate 'widest'; choose one of \['fixed', 'longest'\]"),
    (lambda: PadOptions(mask_dtype="float16"), "unknown mask_dtype"),
    (lambda: PadOptions(truncation="middle"), "unknown truncation"),
    (lambda: PackOptions("best"), "unknown packing 'best'"),
    (lambda: PackOptions(target="logits"), "unknown target"),
    (lambda: PackOptions(buffer_docs=0), r"PackOptions\(buffer_docs=...\) must be an integer >= 1"),
    (lambda: SamplerOptions(num_batches=5), r"pass SamplerOptions\('random', num_batches=5\)"),
    (lambda: CacheOptions(mb=-1), r"CacheOptions\(mb=...\) must be a number of MiB >= 0"),
    (lambda: DomainWeights({"a": -1}), "domain weights must be finite numbers >= 0"),
])
def test_each_group_checks_its_options_where_it_is_built(build, match: str) -> None:
    with pytest.raises(EtlError, match=match):
        build()


def test_a_group_in_the_wrong_place_says_where_it_goes(dst: Path) -> None:
    with pytest.raises(EtlError, match="PackOptions goes to packing="):
        ParquetLoader(dst, batch_size=4, collate=PackOptions("bfd"))
    with pytest.raises(EtlError, match="drop collate="):
        ParquetLoader(dst, batch_size=4, packing="bfd", collate="longest")


@pytest.mark.parametrize("packing", [None, "bfd"])
def test_the_parts_work_with_torch_dataloader(dst: Path, packing: str | None) -> None:
    loader = ParquetLoader(dst, batch_size=4, seed=3, drop_last=False, packing=packing)
    plain = DataLoader(loader.dataset, batch_sampler=loader.sampler, collate_fn=loader.collate_fn)
    batches = list(plain)  # torch's DataLoader alone: dataset, batch sampler, collate function
    assert delivered_targets(batches) == trained_targets(random_examples(50, seed=1), seq_len=16)
    fresh = ParquetLoader(dst, batch_size=4, seed=3, drop_last=False, packing=packing)
    assert _x(batches) == _x(fresh) and _x(plain) == _x(fresh)  # epoch 1 too
