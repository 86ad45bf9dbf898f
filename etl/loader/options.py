"""`ParquetLoader`'s option checks: S against the run's, named choices, rank and world size.

Torch-free at import (the option groups, `etl.loader.groups`, build on it).
"""

from __future__ import annotations

import warnings

from etl.columns import MIN_SEQ_LEN
from etl.errors import EtlError


def _seq_len_error(given: int | None, run_seq_len: int | None) -> str:
    """What is wrong with seq_len and the values it takes (the run's S when there is one)."""
    what = (
        "seq_len is S, the tokens per example before the shift (x and y hold T = S - 1), "
        f"so it must be an integer of {MIN_SEQ_LEN} or more"
    )
    if given is None:
        return f"the output's manifest has no seq_len; pass seq_len=S: {what}"
    fix = f"; leave it out to use the S of `etl run` ({run_seq_len})" if run_seq_len else ""
    return f"seq_len={given} is too small: {what}{fix}"


def resolve_seq_len(given: int | None, run_seq_len: int | None, truncation: str, *, splits: bool = False) -> int:
    """S: `given`, else the run's; an S below the run's is allowed, with a warning unless a
    packer splits long examples across rows (`splits`: sequential, stream) instead of cutting.

    Raises:
        EtlError: S below 2 (one token makes no (x, y) pair at all).
    """
    resolved = int(run_seq_len or 0) if given is None else int(given)
    if resolved < MIN_SEQ_LEN:
        raise EtlError(_seq_len_error(given, run_seq_len))
    if run_seq_len and resolved < int(run_seq_len) and not splits:
        # etl run truncated whole turns to its S; cutting again here is token-level and can
        # leave rows with nothing trained (an all -100 batch makes cross-entropy NaN).
        warnings.warn(
            f"seq_len={resolved} is below the S={run_seq_len} that `etl run` "
            f"used; rows are cut token-wise ({truncation}). Rerun `etl run --seq-len "
            f"{resolved}` to truncate by whole turns instead.",
            stacklevel=3,  # the caller of ParquetLoader(...), through __init__
        )
    return resolved


def check_choice(name: str, value: str, choices: list[str]) -> None:
    """Raise an `EtlError` naming the choices when ``value`` is not one of them."""
    if value not in choices:
        raise EtlError(f"unknown {name} {value!r}; choose one of {choices}")


def rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values, else the initialized process group, else a single process."""
    if rank is not None and world_size is not None:
        return rank, world_size
    # Deferred: the option groups import this module and stay torch-free (~1 s of import).
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return rank or 0, world_size or 1
