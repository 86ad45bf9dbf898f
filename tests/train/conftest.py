"""The loader's fixtures (a written etl output, `dst`), for the training helpers' tests."""

from tests.loader.conftest import dst  # noqa: F401
