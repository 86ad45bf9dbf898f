"""The training helpers' fixtures: the loader's written etl output (`dst`), and one torch thread."""

from collections.abc import Iterator

import pytest
import torch

from tests.loader.conftest import dst  # noqa: F401


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tensors of a few thousand values: intra-op threads cost more than they give, and on a busy
    2-core machine far more (an equality check of test_hf: 0.3 s on one thread, 6-10 s on two)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
