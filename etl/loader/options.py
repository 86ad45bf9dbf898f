"""`ParquetLoader`'s option checks: S against the run's, named choices, rank and world size.

Torch-free at import (the option groups, `etl.loader.groups`, build on it).
"""

from __future__ import annotations

import inspect
import numbers
import warnings
from collections.abc import Callable
from typing import Any

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


# ParquetLoader's everyday keywords: (types, what they take). Integers are checked >= the bound.
_KEYWORDS: dict[str, tuple[type | tuple[type, ...], str, int | None]] = {
    "batch_size": (numbers.Integral, "an integer >= 1", 1),
    "seq_len": ((numbers.Integral, type(None)), "an integer (S), or None for the run's S", None),
    "seed": (numbers.Integral, "an integer >= 0", 0),
    "num_workers": (numbers.Integral, "an integer >= 0", 0),
    "rank": ((numbers.Integral, type(None)), "an integer >= 0, or None", 0),
    "world_size": ((numbers.Integral, type(None)), "an integer >= 1, or None", 1),
    "shuffle": (bool, "True or False", None),
    "drop_last": (bool, "True or False", None),
    "split": (str, "a split name such as 'train' or 'val'", None),
}


def check_keywords(values: dict[str, Any]) -> None:
    """Raise one `EtlError` naming the first everyday keyword of the wrong type or range.

    Why here: a wrong type otherwise fails deep inside (``'<' not supported between str and
    int`` from the sampler) or not at all (``seq_len=2.5`` read as 2, ``shuffle="no"`` as True).
    """
    for name, (types, takes, low) in _KEYWORDS.items():
        value = values[name]
        wrong = not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types))
        if wrong or (low is not None and value is not None and value < low):
            hint = f" (pass {name}={value.strip()})" if isinstance(value, str) and value.strip().isdigit() else ""
            raise EtlError(f"ParquetLoader({name}=...) must be {takes}, got {value!r} "
                           f"({type(value).__name__}){hint}")


def check_unknown(unknown: dict[str, Any], func: Callable[..., Any]) -> None:
    """Raise a `TypeError` naming the first keyword in ``unknown`` and every keyword ``func`` takes.

    Why: Python's own message names the wrong keyword only; the list is the fix for a typo or a
    keyword that moved into an option group (``pad_multiple`` is ``PadOptions(pad_multiple=...)``).
    """
    if unknown:
        taken = [n for n, p in inspect.signature(func).parameters.items() if p.kind is not p.VAR_KEYWORD]
        raise TypeError(f"{func.__qualname__}() got an unexpected keyword argument {next(iter(unknown))!r}; "
                        f"it takes {', '.join(taken)}")


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def check_choice(name: str, value: str, choices: list[str]) -> None:
    """Raise an `EtlError` naming the choices when ``value`` is not one of them."""
    if value not in choices:
        raise EtlError(f"unknown {name} {value!r}; choose one of {choices}")


def rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values, else the initialized process group, else a single process."""
    if rank is not None and world_size is not None:
        return rank, world_size
    # Deferred: the option groups import this module and stay torch-free (torch's import:
    # docs/design.md, Measured costs).
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return rank or 0, world_size or 1
