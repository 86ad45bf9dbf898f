"""Every test runs with its own token cache folder: `etl run` from the command line caches by
default in ~/.cache/etl/tokens, which a test must neither read (a warm cache hides tokenizer work)
nor fill."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def _token_cache_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("token-cache")
    before = os.environ.get("ETL_CACHE_DIR")
    os.environ["ETL_CACHE_DIR"] = str(folder)  # subprocesses inherit it
    yield folder
    if before is None:
        os.environ.pop("ETL_CACHE_DIR", None)
    else:
        os.environ["ETL_CACHE_DIR"] = before
