"""Every test starts without a token cache, as `etl run` does by default: a $ETL_CACHE_DIR in the
developer's environment would turn one on, and a warm cache hides tokenizer work. Tests of the
cache name their own folder (tests/cache/conftest.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _no_token_cache() -> Iterator[None]:
    before = os.environ.pop("ETL_CACHE_DIR", None)  # subprocesses inherit its absence
    yield
    if before is not None:
        os.environ["ETL_CACHE_DIR"] = before
