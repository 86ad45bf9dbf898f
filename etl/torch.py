"""`etl.torch`: the old name of the training loader, kept one release; import from `etl.loader`.

    from etl.loader import ParquetLoader, ParquetDataset, EpochSampler, collate
"""

from __future__ import annotations

import warnings

from etl.loader import *
from etl.loader import __all__  # noqa: F401

warnings.warn(
    "etl.torch is deprecated and will be removed in the next release; import from etl.loader",
    DeprecationWarning,
    stacklevel=2,
)
