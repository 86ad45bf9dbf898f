"""Names a package exports without importing their modules until asked (PEP 562).

`etl.loader`, `etl.train` and `etl.export` export names whose modules pull in torch, numpy or
h5py; a user of another stage (`etl stats`, `etl run --help`) should not pay for those imports.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """The package's `__getattr__`: name -> its module, relative to `package` (or a whole `etl.`
    path), imported on first use."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = exports[name]
        return getattr(importlib.import_module(module if module.startswith("etl.") else f"{package}.{module}"), name)

    return __getattr__
