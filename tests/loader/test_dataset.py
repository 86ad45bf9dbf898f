"""ParquetDataset: metadata-only index, lazy row-group reads, LRU cache, filter, pickling."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.columns import INPUT_IDS, LOSS_MASK, LOSS_WEIGHT
from etl.errors import EtlError
from etl.loader.dataset import ParquetDataset
from tests.helpers import seal

from .conftest import random_examples, write_dst


def rows_of(batch) -> list[tuple[list[int], list[bool]]]:
    spans = zip(batch.starts.tolist(), batch.lengths.tolist(), strict=True)
    return [(batch.ids[s : s + n].tolist(), batch.mask[s : s + n].tolist()) for s, n in spans]


def test_index_comes_from_metadata_without_reading_data(
    dst: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args, **kwargs):
        raise AssertionError("data pages were read while building the index")

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", boom)
    monkeypatch.setattr(pq, "read_table", boom)
    ds = ParquetDataset(dst, split="train")  # min_tokens=2 passes on footer statistics alone
    assert len(ds) == 50 and ds.row_group_reads == 0
    # 3 files of 20/20/10 rows in row groups of 8: groups 8,8,4 | 8,8,4 | 8,2.
    assert np.bincount(ds.row_groups).tolist() == [8, 8, 4, 8, 8, 4, 8, 2]


def test_getitem_and_getitems_return_the_written_rows(dst: Path) -> None:
    expected = random_examples(50, seed=1)
    ds = ParquetDataset(dst, split="train")
    for i in (0, 7, 8, 19, 20, 49, -1):
        item = ds[i]
        assert item[INPUT_IDS].dtype == np.int32 and item[LOSS_MASK].dtype == np.bool_
        assert (item[INPUT_IDS].tolist(), item[LOSS_MASK].tolist()) == expected[i]
    order = [49, 0, 25, 8, 9, 0, 41]  # across files and row groups, with a repeat
    assert rows_of(ds.__getitems__(order)) == [expected[i] for i in order]
    with pytest.raises(IndexError):
        ds[50]


def test_lru_cache_reads_each_row_group_once_while_it_stays_cached(dst: Path) -> None:
    ds = ParquetDataset(dst, split="train", cache_row_groups=2, cache_mb=0)
    ds.__getitems__([0, 1, 2, 8, 9])  # groups 0 and 1
    assert ds.row_group_reads == 2
    ds.__getitems__([3, 10, 4])  # both cached
    assert ds.row_group_reads == 2
    ds[16]  # group 2 evicts group 0 (least recently used)
    ds[9]  # group 1 still cached
    assert ds.row_group_reads == 3
    ds[0]
    assert ds.row_group_reads == 4


def test_min_tokens_filter_skips_short_rows(tmp_path: Path) -> None:
    examples = random_examples(12, seed=3)
    examples[2] = ([5], [False])
    examples[9] = ([], [])
    examples[10] = ([7, 8], [False, True])
    root = write_dst(tmp_path / "d", {"train": examples}, rows_per_group=4)
    ds = ParquetDataset(root, split="train")  # default 2: drops rows 2 and 9
    assert len(ds) == 10
    kept = [i for i in range(12) if i not in (2, 9)]
    assert rows_of(ds.__getitems__(list(range(10)))) == [examples[i] for i in kept]
    assert len(ParquetDataset(root, split="train", min_tokens=0)) == 12
    at_least_3 = sum(len(ids) >= 3 for ids, _ in examples)
    assert len(ParquetDataset(root, split="train", min_tokens=3)) == at_least_3 < 10


def test_pickled_copy_starts_with_an_empty_cache(dst: Path) -> None:
    ds = ParquetDataset(dst, split="val")
    before = ds.__getitems__([3, 1])
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.row_group_reads == 0 and not copy._cache
    assert rows_of(copy.__getitems__([3, 1])) == rows_of(before)


def test_loss_weight_column_is_read_unless_turned_off(tmp_path: Path) -> None:
    examples = [([1, 2, 3], [False, True, True]), ([4, 5], [False, True])]
    root = write_dst(tmp_path / "w", {"train": examples}, weights={"train": [[0, 1, 2], [0, 3]]})
    assert ParquetDataset(root)[1][LOSS_WEIGHT].tolist() == [0.0, 3.0]  # default: when present
    assert LOSS_WEIGHT not in ParquetDataset(root, weights=False)[0]
    assert ParquetDataset(root, weights=True)[1][LOSS_WEIGHT].tolist() == [0.0, 3.0]


def test_clear_errors(dst: Path, tmp_path: Path) -> None:
    with pytest.raises(EtlError, match="splits present: \\['train', 'val'\\]"):
        ParquetDataset(dst, split="test")
    with pytest.raises(EtlError, match="etl run"):
        ParquetDataset(tmp_path / "nothing")


def test_byte_budget_keeps_more_row_groups_when_they_fit(dst: Path) -> None:
    ds = ParquetDataset(dst, split="train", cache_row_groups=1, cache_mb=1)
    for _ in range(2):  # all 8 groups fit in 1 MiB: the second pass reads nothing
        ds.__getitems__(list(range(50)))
    assert ds.row_group_reads == 8
    tight = ParquetDataset(dst, split="train", cache_row_groups=1, cache_mb=0)
    for _ in range(2):
        tight.__getitems__(list(range(50)))
    assert tight.row_group_reads == 16


def test_uint8_loss_mask_is_read_as_bool(dst: Path) -> None:
    # The contract allows list<uint8> masks; rewrite the fixture's first file that way.
    path = dst / "data" / "val" / "part-00000.parquet"
    table = pq.read_table(path)
    as_uint8 = table.set_column(
        table.schema.get_field_index(LOSS_MASK),
        LOSS_MASK,
        table[LOSS_MASK].cast(pa.list_(pa.uint8())),
    )
    pq.write_table(as_uint8, path, row_group_size=4)
    seal(dst)  # as if etl had written it so
    ds = ParquetDataset(dst, split="val")
    expected = random_examples(10, seed=2)
    assert ds[3][LOSS_MASK].dtype == np.bool_
    assert rows_of(ds.__getitems__(list(range(10)))) == expected
