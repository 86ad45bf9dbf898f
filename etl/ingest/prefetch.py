"""Run a generator one step ahead on a background thread: one item in flight, errors forwarded.

`etl run` reads and parses chunk k+1 (file I/O and DuckDB, both outside the GIL) while the
main thread tokenizes chunk k, which fills the gaps the tokenizer leaves on 2 cores.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


def prefetch(items: Iterator[T]) -> Iterator[T]:
    """Yield the items of `items`, produced one ahead on a daemon thread.

    Memory stays bounded (one finished item waits while the consumer works on the previous
    one). An exception in the producer is raised in the consumer; a consumer that stops early
    stops the producer at its next item.
    """
    slot: queue.Queue[tuple[bool, object]] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def put(entry: tuple[bool, object]) -> bool:
        while not stop.is_set():
            try:
                slot.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((True, item)):
                    return
            put((True, _DONE))
        except BaseException as exc:  # noqa: BLE001 (forwarded to the consumer, who re-raises it)
            put((False, exc))

    thread = threading.Thread(target=produce, name="etl-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            ok, item = slot.get()
            if not ok:
                assert isinstance(item, BaseException)
                raise item
            if item is _DONE:
                return
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        thread.join(timeout=5)
