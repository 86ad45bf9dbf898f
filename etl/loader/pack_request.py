"""`PackRequest`: what a `PackSampler` hands to ``ParquetDataset.__getitems__`` for one batch.

Its own module because both sides need it and the sampler module also needs the dataset.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PackRequest:
    """One batch of packs as pieces; what the sampler hands to ``ParquetDataset.__getitems__``.

    Attributes:
        rows: (P,) global row (in the split's listed parts) of each piece's example.
        start, length: (P,) token range of each piece inside its example.
        row: (P,) batch row of each piece; segment: (P,) its 1-based document in that row.
        num_rows: B.
        trained: (P,) bool piece flags (boundary injection), or None.
    """

    rows: np.ndarray
    start: np.ndarray
    length: np.ndarray
    row: np.ndarray
    segment: np.ndarray
    num_rows: int
    trained: np.ndarray | None = None
