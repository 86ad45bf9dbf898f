"""`etl.torch`: the name DESIGN §6 gives the training loader; the code lives in `etl.loader`.

    from etl.torch import ParquetLoader, ParquetDataset, EpochSampler, collate
"""

from __future__ import annotations

from etl.loader import *
from etl.loader import __all__  # noqa: F401
