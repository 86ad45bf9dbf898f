"""Every token-cache test runs with its own cache folder: $ETL_CACHE_DIR points into the test's
tmp folder (never ~/.cache), and $ETL_CACHE_MAX_GB is unset so the default cap applies."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cache.common import train_tokenizer


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The default cache root of this test: tmp_path/default-cache (made on first use)."""
    root = tmp_path / "default-cache"
    monkeypatch.setenv("ETL_CACHE_DIR", str(root))
    monkeypatch.delenv("ETL_CACHE_MAX_GB", raising=False)
    return root


@pytest.fixture(scope="session")
def tiny_tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer.json trained once per session (tests only read it)."""
    return train_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer") / "tokenizer.json")
