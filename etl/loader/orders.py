"""Epoch orders: seeded permutations (with block shuffling), draws with replacement, rank splits.

Pure functions of (seed + epoch, rank, world_size), shared by the batch samplers
(`etl.loader.samplers`), the pack sampler and the episode loader.
"""

from __future__ import annotations

import numpy as np

from etl.errors import EtlError


def epoch_order(
    num_rows: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    blocks: int | np.ndarray = 0,
    mix: int = 1,
) -> np.ndarray:
    """The order of rows in one epoch: a permutation seeded by ``seed + epoch`` (deterministic epochs).

    Block shuffling (``blocks`` != 0) trades randomness for locality: rows are grouped into blocks
    (ideally one per Parquet row group), the block order is permuted, and rows are shuffled inside
    windows of ``mix`` consecutive blocks of that order. A batch then touches at most ``mix`` row
    groups, so a row-group cache of ``mix`` entries reads each group about once per epoch, instead
    of up to B groups per batch under a full shuffle (a group read's cost: docs/design.md,
    Measured costs). The price: the rows of one batch come from ``mix`` random row groups, not
    from the whole split, so keep ``mix`` high enough that a window holds many sources.

    Args:
        num_rows: rows in the split (N).
        seed: base seed; the generator is seeded with ``seed + epoch``.
        epoch: epoch number (0-based).
        shuffle: False gives ``0..N-1`` in order.
        blocks: 0 for a full shuffle; an int b for blocks of b consecutive rows; or an (N,) array
            with the block label of every row (e.g. its row group).
        mix: blocks per shuffling window.

    Returns:
        (N,) int64 permutation of ``0..N-1``.
    """
    if not shuffle:
        return np.arange(num_rows, dtype=np.int64)
    rng = np.random.default_rng(seed + epoch)
    if isinstance(blocks, (int, np.integer)):
        if blocks <= 0:
            return rng.permutation(num_rows).astype(np.int64, copy=False)
        labels = np.arange(num_rows, dtype=np.int64) // int(blocks)
    else:
        labels = np.asarray(blocks)
        if labels.shape != (num_rows,):
            raise EtlError(f"blocks must have one label per row ({num_rows}), got {labels.shape}")
    if mix < 1:
        raise EtlError(f"mix must be >= 1 block per window, got {mix}")
    _, dense = np.unique(labels, return_inverse=True)
    block_rank = rng.permutation(int(dense.max(initial=-1)) + 1)
    window = block_rank[dense] // mix
    return np.lexsort((rng.random(num_rows), window)).astype(np.int64, copy=False)


def random_rows(
    num_rows: int,
    *,
    seed: int,
    epoch: int,
    num_batches: int,
    batch_size: int,
    rank: int | None = 0,
    world_size: int = 1,
) -> np.ndarray:
    """Uniform draws with replacement for one "epoch" of ``num_batches`` batches on one rank.

    All ranks draw the same (num_batches, world_size, batch_size) block from ``seed + epoch`` and
    keep their own column, so ranks differ and a rank's draws do not depend on world order.

    Returns:
        (num_batches, batch_size) int64 row ids; rank None: every rank's draws, step by step,
        (num_batches, world_size * batch_size).
    """
    rng = np.random.default_rng(seed + epoch)
    draws = rng.integers(0, num_rows, size=(num_batches, world_size, batch_size), dtype=np.int64)
    return draws.reshape(num_batches, -1) if rank is None else draws[:, rank]


def split_for_rank(
    order: np.ndarray, *, batch_size: int, drop_last: bool, rank: int, world_size: int
) -> list[np.ndarray]:
    """This rank's batches of an epoch order, with the same batch count on every rank.

    Rank r takes every ``world_size``-th row, so global batch j is ``order[j*B*W:(j+1)*B*W]``
    and block locality survives. ``drop_last`` drops the tail that does not fill a batch on every
    rank; otherwise the order is padded by wrapping around (fewer than ``world_size`` rows repeat,
    none when N is a multiple of ``world_size``) and the last batch may be short.
    """
    n, per_global = len(order), batch_size * world_size
    if drop_last:
        order = order[: n // per_global * per_global]
    else:
        padded = -(-n // world_size) * world_size
        order = np.concatenate([order, order[: padded - n]]) if padded > n else order
    mine = order[rank::world_size]
    return np.split(mine, np.arange(batch_size, len(mine), batch_size))


def interleave_for_workers(num_batches: int, num_workers: int) -> np.ndarray:
    """Batch order that gives each DataLoader worker a contiguous stretch of the epoch.

    DataLoader hands batch k to worker ``k % num_workers``. Splitting the epoch into
    ``num_workers`` contiguous chunks and interleaving them round-robin means worker w reads
    chunk w front to back, so its row-group cache sees block locality (without this, both workers
    would read every row group). The order still covers every batch exactly once.
    """
    if num_workers <= 1:
        return np.arange(num_batches, dtype=np.int64)
    chunk = np.concatenate(
        [
            np.full(len(c), i)
            for i, c in enumerate(np.array_split(np.arange(num_batches), num_workers))
        ]
    )
    within = np.arange(num_batches) - np.searchsorted(chunk, chunk)
    return np.lexsort((chunk, within)).astype(np.int64, copy=False)
