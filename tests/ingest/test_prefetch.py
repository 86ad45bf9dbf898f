"""The prefetch thread: starts at once, keeps one item ahead at most, forwards errors, stops."""

from __future__ import annotations

import threading
import time

import pytest

from etl.ingest.prefetch import Prefetch


def _counting(n: int, made: list[int], fail_at: int | None = None):
    for i in range(n):
        if i == fail_at:
            raise ValueError(f"bad item {i}")
        made.append(i)
        yield i


def _settle(made: list[int], expect: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while len(made) < expect and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # long enough for a producer that ran further ahead to show it


def test_starts_before_the_first_next_and_stays_one_ahead():
    made: list[int] = []
    with Prefetch(_counting(10, made)) as items:
        _settle(made, 1)
        assert made == [0]  # produced without being asked, and no second item meanwhile
        it = iter(items)
        assert next(it) == 0
        _settle(made, 2)
        assert made == [0, 1]  # the consumer holds item 0: exactly one more is made
        assert next(it) == 1
        assert list(it) == list(range(2, 10))


def test_a_producer_error_reaches_the_consumer_after_the_items_before_it():
    made: list[int] = []
    got: list[int] = []
    with pytest.raises(ValueError, match="bad item 3"), Prefetch(_counting(10, made, fail_at=3)) as items:
        got.extend(items)
    assert got == [0, 1, 2]


def test_leaving_early_stops_the_producer():
    made: list[int] = []
    with Prefetch(_counting(1000, made)) as items:
        for item in items:
            if item == 2:
                break
    threads = [t for t in threading.enumerate() if t.name == "etl-prefetch"]
    assert not threads
    assert len(made) <= 4
