"""`PACKERS`: strategy name -> packing function, and `pack`, the one entry point by name.

Every packer maps (N,) example lengths to a `Packing` of at most ``seq_len`` tokens per pack.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import numpy as np

from etl.errors import EtlError
from etl.packing.bins import bfd, ffd
from etl.packing.pieces import Packing
from etl.packing.sequential import sequential
from etl.packing.stream import stream


class PackFn(Protocol):
    """Signature shared by every entry of `PACKERS`.

    ``seed`` is part of the signature for every packer so callers can pass it blindly; packers
    with no random choice (bfd, ffd, sequential) ignore it. Strategy-specific knobs
    (``buffer_docs``, ``max_docs_per_bin``, stream's ``turns``) are keyword options.
    """

    def __call__(
        self, lengths: np.ndarray, *, seq_len: int, seed: int = 0, **options: Any
    ) -> Packing: ...


# One packer per name of etl.columns.PACK_STRATEGIES (where `etl pack --help` reads the names
# without importing numpy); tests/packing/test_index.py keeps the two equal.
PACKERS: dict[str, PackFn] = {
    "bfd": bfd,
    "ffd": ffd,
    "sequential": sequential,
    "stream": stream,  # boundary injection; needs turns=TurnSpans (etl.packing.index reads them for etl pack)
}


def pack(
    strategy: str, lengths: np.ndarray, *, seq_len: int, seed: int = 0, **options: Any
) -> Packing:
    """Pack ``lengths`` with the packer named ``strategy`` (a key of `PACKERS`).

    Raises:
        EtlError: for an unknown strategy or an option the packer does not take (the message
            lists the choices), or from the packer.
    """
    fn = PACKERS.get(strategy)
    if fn is None:
        raise EtlError(f"unknown packing strategy {strategy!r}; choose one of {sorted(PACKERS)}")
    params = inspect.signature(fn).parameters
    accepted = sorted(k for k, p in params.items() if p.kind is p.KEYWORD_ONLY and k != "seq_len")
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise EtlError(f"packing {strategy!r} takes no option {unknown}; its options: {accepted}")
    return fn(lengths, seq_len=seq_len, seed=seed, **options)
