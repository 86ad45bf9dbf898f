"""Images read (`etl.images.read`) in worker processes, beside the run's own threads.

Reading an image is its sha256 (no GIL) and Pillow's header parse (GIL held). In threads, each
hash's return waits for the GIL behind the header parses and the run's own Python: on the 10,001
images of bench/images.py, 8 threads took 1.7 s against 1.4 s on one, and slowed the planning
beside them. Worker processes hold no GIL of the run's: 2 workers read them in 0.67 s. They are
spawned, not forked (a fork after Polars' and DuckDB's threads have started can hang), at the
run's start, so that their imports (~0.15 s) overlap the first chunk's parse.

Object-store references stay in this process, whose threads overlap their latency better than
a few sequential workers. A spawned process runs the
parent's main script again as a module (`multiprocessing.spawn`): workers start only where that is
harmless (etl's console script, `python -m`, `-c`, a notebook), not under a user's script, which
may have no `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Self

import pyarrow as pa

from etl.images.read import read_images, read_rows, rows_table
from etl.ingest.discover import is_uri
from etl.ingest.location import scheme

# Images a worker reads per task: 10,001 images in ~20 tasks (~30 ms each) share two workers
# evenly, and a task's rows (~200 bytes an image, no image bytes) cost little to send back.
TASK_IMAGES = 512
MAX_WORKERS = 8  # the reading is ~0.12 ms an image; more workers than this only cost memory
THREAD_IMAGES = 64  # fewer images than this are read in this process: a task costs ~1 ms more
# Input smaller than this reads its images on threads: ~2,000 images of LLaMA-Factory-style records
# (~500 bytes each), which 2 workers read ~0.1 s sooner than threads, while starting them costs
# ~0.3 s of CPU.
WORKERS_FROM_BYTES = 1 << 20


def _remote(location: Any) -> bool:
    """An object-store URI (a path, `file://` and data URIs are not)."""
    return isinstance(location, str) and is_uri(location) and scheme(location) != "file"


def _spawn_safe() -> bool:
    """Whether a spawned process would run no code of this process's main script: `-m` packages'
    `__main__` and scripts without a file are skipped (`multiprocessing.spawn`), and etl's console
    script only imports `etl.cli.main` outside its guard."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        return name == "__main__" or name.endswith(".__main__")
    path = getattr(main, "__file__", None)
    if path is None:
        return True
    return (os.path.basename(path).removesuffix(".exe") == "etl"  # the console script pip wrote
            and getattr(getattr(main, "main", None), "__module__", None) == "etl.cli")


def _quiet() -> None:
    """A worker ignores Ctrl-C: the run stops them (a traceback per worker said nothing more)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _ready() -> int:
    """A worker's first task: nothing, once its imports are done."""
    return os.getpid()


class ImageWorkers:
    """A pool of spawned processes that read local image files. `read` returns at once; its
    result waits for the workers. State: the pool, started at the run's start, closed at its end."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context("spawn"), initializer=_quiet)
        for _ in range(workers):  # start them now: their imports overlap the first parse
            self._pool.submit(_ready)
        self._thread = ThreadPoolExecutor(max_workers=1)  # reads that stay in this process

    @classmethod
    def start(cls, input_bytes: int) -> ImageWorkers | None:
        """Workers, one per CPU this process may use (at most MAX_WORKERS), for a run of
        `input_bytes`; None with one CPU, a small input, or a main script spawning would run."""
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        if cpus < 2 or input_bytes < WORKERS_FROM_BYTES or not _spawn_safe():
            return None
        try:
            return cls(min(cpus, MAX_WORKERS))
        except (OSError, ImportError, NotImplementedError):  # no process start, no semaphores (/dev/shm)
            return None

    def read(self, refs: Sequence[Any], *, base: str | None, root: str | None,
             keep_bytes: bool | str) -> Callable[[], pa.Table]:
        """What `read_images(refs, ...)` returns, read in the workers: call the result for it."""
        paths = (r.get("path") if isinstance(r, Mapping) else r for r in refs)
        local = not (_remote(base) or _remote(root) or any(map(_remote, paths)))
        tasks = self._submit(refs, base, root, keep_bytes) if local and len(refs) >= THREAD_IMAGES else None
        if tasks is None:  # on a thread, as read_chunk_images reads without workers
            return self._thread.submit(read_images, refs, base=base, root=root, keep_bytes=keep_bytes).result
        return lambda: rows_table(self._gather(tasks, refs, base, root, keep_bytes))

    def _submit(self, refs: Sequence[Any], base: str | None, root: str | None,
                keep_bytes: bool | str) -> list[Future] | None:
        """The reads' tasks in the workers; None when there are none to take them (stopped, or broken)."""
        pool = self._pool  # once: the main thread may stop a broken pool while the prefetch thread reads
        try:
            return None if pool is None else [pool.submit(read_rows, refs[at:at + TASK_IMAGES], base, root, keep_bytes)
                                              for at in range(0, len(refs), TASK_IMAGES)]
        except (BrokenProcessPool, RuntimeError):  # broken, or stopped meanwhile (RuntimeError: after shutdown)
            return None

    def _gather(self, tasks: list[Future], refs: Sequence[Any], base: str | None, root: str | None,
                keep_bytes: bool | str) -> list[tuple]:
        """The tasks' rows in order; a pool that broke (a worker killed) is read again here."""
        try:
            return [row for task in tasks for row in task.result()]
        except BrokenProcessPool:
            self._stop_pool()
            return read_rows(refs, base, root, keep_bytes, threads=8)

    def _stop_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def close(self) -> None:
        """Stop the workers and the thread (idempotent)."""
        self._stop_pool()
        self._thread.shutdown(wait=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
