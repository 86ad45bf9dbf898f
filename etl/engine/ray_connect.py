"""Join the Ray cluster at `--ray-address` (or RAY_ADDRESS) within a deadline, or start a local one.

`ray.init` to an address no Ray cluster answers retries for many minutes (Ray's schedule:
docs/design.md, Measured costs), inside C++ calls that hold off Ctrl-C. So a plain TCP connect
comes first (nothing listening fails in milliseconds, with no Ray warnings), then `ray.init` runs
on a daemon thread that the driver waits for with a deadline: the wait is Python's, so Ctrl-C ends
it at once, and an attempt past the deadline dies with the process.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from etl.columns import RAY_CONNECT_TIMEOUT_S
from etl.errors import EtlError

POLL_S = 0.1  # how soon Ctrl-C ends the wait (see _Attempt.wait)
_SIGTERM_NOTE = "SIGTERM handler is not set"  # Ray's warning when ray.init runs off the main thread


def check_timeout(timeout: float) -> None:
    """Refuse a --ray-timeout that is not a positive finite number of seconds."""
    if not (math.isfinite(timeout) and timeout > 0):
        raise EtlError(f"--ray-timeout is {timeout:g}; pass a positive number of seconds "
                       f"(default {RAY_CONNECT_TIMEOUT_S:g})")


def connect(address: str | None, *, timeout: float | None = None, quiet: bool = False) -> bool:
    """Join the cluster at `address` (else RAY_ADDRESS) within `timeout` seconds (None: the default,
    30), or start a local one (no deadline: Ray's start waits in Python, so Ctrl-C works); True if
    we started it.

    `quiet` (--quiet): Ray's Python warnings too (its token-auth notice), and no worker output
    forwarded to the driver; a failure still reaches the user as an exception. Ray's C++ core
    writes to stderr past Python's logging (RAY_BACKEND_LOG_LEVEL is read only once the core worker
    starts, after the connect's retries, and prints a line of its own): `held_stderr` holds it.

    Raises:
        EtlError: one line naming the address and what to do, when no cluster answered in time.
    """
    # ray (a slow import: docs/design.md, Measured costs): only when the Ray engine is used
    import ray

    timeout = RAY_CONNECT_TIMEOUT_S if timeout is None else timeout
    check_timeout(timeout)
    if ray.is_initialized():
        return False
    level = logging.ERROR if quiet else logging.WARNING
    target = address or os.environ.get("RAY_ADDRESS") or None
    if target in (None, "local"):
        with held_stderr(replay=not quiet):
            _init(address, level)
        return True
    source = "--ray-address" if address else "RAY_ADDRESS"
    where, advice = f"{target} ({source})", _advice(source)
    if threading.current_thread() is threading.main_thread():
        # What ray.init does on the main thread: SIGTERM exits through atexit's ray.shutdown.
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(signum))
    logging.getLogger("ray._private.worker").addFilter(_drop_sigterm_note)
    attempt = _Attempt(lambda: _probe(target, where, advice, timeout=timeout),
                       lambda: _init(address, level, where, advice))
    # A failed connect is etl's one line: Ray's C++ GCS client logs a line for each retry
    # (docs/design.md, Measured costs).
    with held_stderr(replay=not quiet) as hold:
        if attempt.wait(timeout):
            return True
        hold.for_good = True  # the abandoned attempt keeps retrying (and logging) until the process ends
        stage = ("accepts connections but no Ray cluster answered" if attempt.reached.is_set()
                 else "did not answer (a host that is down, or a firewall that drops the connection)")
        raise EtlError(f"--engine ray: {where} {stage} within {timeout:g} s; {advice}, or raise --ray-timeout")


@dataclass
class _Hold:
    for_good: bool = False  # keep holding fd 2 after the block; sys.stderr moves to a copy of it


@contextlib.contextmanager
def held_stderr(*, replay: bool) -> Iterator[_Hold]:
    """Hold what the process writes to file descriptor 2 in the block, then write it out when the
    block ends well and `replay`, or when an error other than etl's own (or Ctrl-C) ends it: Ray's
    lines may explain that one. Ray's C++ core writes there past Python's logging (`gcs_client.cc` per connect
    retry, `core_worker.cc` during a run); an EtlError is one line of its own, printed after.
    The held text goes to an unlinked temporary file (a few KiB per run). With `for_good` set,
    fd 2 stays held after the block (an abandoned connect attempt's C++ thread logs there until
    the process ends) and Python's sys.stderr writes to the real stderr through a copy of it.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    hold = _Hold()
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        show = replay
        try:
            yield hold
        except (EtlError, KeyboardInterrupt):
            show = False
            raise
        except BaseException:
            show = True
            raise
        finally:
            sys.stderr.flush()
            if hold.for_good:
                sys.stderr = open(saved, "w", encoding=sys.stderr.encoding, errors="backslashreplace",  # noqa: SIM115
                                  buffering=1)
            else:
                os.dup2(saved, 2)
                os.close(saved)
            if show:
                held.seek(0)
                sys.stderr.buffer.write(held.read())
                sys.stderr.flush()


def _advice(source: str) -> str:
    drop = "drop --ray-address" if source == "--ray-address" else "unset RAY_ADDRESS"
    return (f"start one there (`ray start --head --port PORT` prints the address to pass), {drop} to run "
            "on a local Ray")


def _host_port(target: str) -> tuple[str, int] | None:
    """(host, port) of `host:port`, `[v6]:port` or `ray://host:port`; None for another form
    ("auto": Ray looks the address up itself), which skips the TCP probe."""
    host, _, port = target.removeprefix("ray://").rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None


def _probe(target: str, where: str, advice: str, *, timeout: float) -> None:
    """A TCP connect to the address: nothing listening, no route or an unknown host fails here in
    milliseconds, before Ray prints a warning per retry."""
    found = _host_port(target)
    if found is None:
        return
    try:
        socket.create_connection(found, timeout=timeout).close()
    except OSError as exc:  # TimeoutError included: the driver's deadline has passed by then
        raise EtlError(f"--engine ray: cannot reach {where}: {exc.strerror or exc}; {advice}") from None


def _init(address: str | None, level: int, where: str = "the cluster",
          advice: str = "check --ray-address / RAY_ADDRESS and that the cluster runs (`ray status`)") -> None:
    # ray (a slow import: docs/design.md, Measured costs): only when the Ray engine is used
    import ray

    try:
        # log_to_driver: with --quiet (level ERROR) no worker prints reach this process
        # A Ray that etl starts for one run has no dashboard: its start competed with the run's on
        # 2 cores (T0 x3 `--engine ray`, one run each: 17.3 -> 16.2 s; docs/ray.md)
        started = {} if address else {"include_dashboard": False}
        ray.init(address=address, logging_level=level, log_to_driver=level < logging.ERROR, **started)
    except ConnectionError as exc:
        # Ray's last try, as text (a traceback in a RuntimeError), after its retries (docs/design.md,
        # Measured costs).
        if "AuthenticationError" in str(exc.__cause__):
            raise EtlError(f"--engine ray: {where} refused this driver's auth token; export RAY_AUTH_MODE=token "
                           "(Ray turns it on by itself only for a cluster it finds locally) and give this user "
                           "the cluster's token (~/.ray/auth_token, or RAY_AUTH_TOKEN)") from exc
        raise EtlError(f"--engine ray: {where} is not a Ray cluster that answers ({exc}); {advice}") from exc


class _Attempt:
    """`probe`, then `init`, on a daemon thread the driver can give up on: DNS, the TCP connect and
    Ray's C++ retries all block outside Python, where neither a deadline nor Ctrl-C reaches."""

    def __init__(self, probe: Callable[[], None], init: Callable[[], None]) -> None:
        self.probe, self.init = probe, init
        self.reached = threading.Event()  # the probe got through
        self.result: Future[None] = Future()
        self.lock = threading.Lock()
        self.abandoned = False
        threading.Thread(target=self._work, name="etl-ray-init", daemon=True).start()

    def wait(self, timeout: float) -> bool:
        """True once connected; False when `timeout` passed first (the thread is abandoned).

        Waits in slices of POLL_S: the kernel may hand Ctrl-C's SIGINT to one of Ray's threads,
        which only flags it for Python, and the main thread sees the flag (KeyboardInterrupt) when
        its wait returns; one long wait held it until the timeout. An error of the attempt is
        raised here.
        """
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(FutureTimeout):  # not yet: wait another slice
                self.result.result(timeout=min(left, POLL_S))
                return True
        with self.lock:  # an attempt that ends now either counts or is abandoned, not both
            self.abandoned = True
            if not self.result.done():
                return False
        self.result.result()
        return True

    def _work(self) -> None:
        # ray (a slow import: docs/design.md, Measured costs): only when the Ray engine is used
        import ray

        try:
            self.probe()
            self.reached.set()
            self.init()
        except BaseException as exc:  # noqa: BLE001 (raised in the waiting driver)
            self.result.set_exception(exc)
            return
        with self.lock:
            late = self.abandoned
            if not late:
                self.result.set_result(None)
        if late:  # a library caller that got the timeout error is left without a connection
            ray.shutdown()


def _drop_sigterm_note(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_SIGTERM_NOTE)
