"""Run one child process and measure it alone: wall seconds, CPU seconds and peak RSS (`os.wait4`).

`resource.getrusage(RUSAGE_CHILDREN)` would mix every child so far (its peak is the largest
ever); `wait4` returns the rusage of the one process waited for.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Run:
    """What one child cost: wall and CPU (user + system) seconds, peak RSS in KiB, and its output."""

    wall: float
    cpu: float
    peak_kib: int
    output: str

    @property
    def peak_mib(self) -> float:
        return self.peak_kib / 1024


def run_child(cmd: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None) -> Run:
    """Run `cmd` to its end; stdout and stderr are kept (in a temp file: no pipe can fill up).

    Raises:
        RuntimeError: the child exited non-zero (the message holds its last output).
    """
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=None if env is None else dict(env), cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {' '.join(cmd)}\n{text[-2000:]}")
    return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss, text)
