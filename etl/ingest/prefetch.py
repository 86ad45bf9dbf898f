"""Run a generator one step ahead on a background thread: one item in flight, errors forwarded.

`etl run` reads and parses chunk k+1 (file I/O and DuckDB, both outside the GIL) while the
main thread tokenizes chunk k, which fills the gaps the tokenizer leaves on 2 cores. The
thread starts when the `Prefetch` is made, not when it is first iterated, so the first chunk
is parsed while the main thread still loads Polars and the tokenizer (docs/design.md, Start-up).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Generic, Self, TypeVar

T = TypeVar("T")
_DONE = object()


class Prefetch(Generic[T]):
    """The items of `items`, produced one ahead on a daemon thread started at once.

    Memory stays bounded: the next item is produced only once the consumer has taken the
    previous one, so at most one finished item waits while the consumer works, and no second
    one is in production meanwhile (for `etl run`: a 16 MiB chunk and DuckDB's ~100 MiB parse
    peak less at once). An exception in the producer is raised in the consumer. Leaving the
    `with` block, normally or not, stops the producer at its next item.
    """

    def __init__(self, items: Iterator[T]) -> None:
        self._slot: queue.Queue[tuple[bool, object]] = queue.Queue(maxsize=1)
        self._room = threading.Semaphore(1)  # released when the consumer takes an item
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, args=(items,), name="etl-prefetch", daemon=True)
        self._thread.start()

    def _wait_room(self) -> bool:
        """Block until the consumer has taken the last item; False when told to stop."""
        while not self._stop.is_set():
            if self._room.acquire(timeout=0.1):
                return True
        return False

    def _produce(self, items: Iterator[T]) -> None:
        try:
            while self._wait_room():
                item = next(items, _DONE)
                self._put((True, item))
                if item is _DONE:
                    return
        except BaseException as exc:  # noqa: BLE001 (forwarded to the consumer, who re-raises it)
            self._put((False, exc))

    def _put(self, entry: tuple[bool, object]) -> None:
        self._slot.put(entry)  # never blocks: the room taken before producing was the slot's

    def __iter__(self) -> Iterator[T]:
        while True:
            ok, item = self._slot.get()
            self._room.release()
            if not ok:
                assert isinstance(item, BaseException)
                raise item
            if item is _DONE:
                return
            yield item  # type: ignore[misc]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
