"""Run one child process and measure it alone: wall seconds, CPU seconds and peak RSS.

Peak RSS comes from `os.wait4` in a small launcher (this file run as a script), not in the caller:
on Linux a child's `ru_maxrss` starts at its parent's resident size (fork copies it, and exec keeps
the larger of it and the new program's peak), so `true` run from a 1 GB benchmark process reports
1 GB. The launcher is ~10 MiB, so that is all it can add. `RUSAGE_CHILDREN` would also mix every
child so far.

    python bench/child.py REPORT.json -- CMD ...   # runs CMD, writes {"wall", "cpu", "peak_kib"}
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


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
    """Run `cmd` to its end through the launcher; stdout and stderr are kept (in a temp file: no
    pipe can fill up). Wall seconds exclude the launcher's own start (~30 ms).

    Raises:
        RuntimeError: the command exited non-zero (the message holds its last output).
    """
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8") as out, tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "run.json"
        launcher = [sys.executable, str(Path(__file__).resolve()), str(report), "--", *cmd]
        code = subprocess.run(launcher, stdout=out, stderr=subprocess.STDOUT, check=False,
                              env=None if env is None else dict(env), cwd=cwd).returncode
        out.seek(0)
        text = out.read()
        if code != 0 or not report.is_file():
            raise RuntimeError(f"exit {code}: {' '.join(cmd)}\n{text[-2000:]}")
        measured = json.loads(report.read_text())
    return Run(measured["wall"], measured["cpu"], measured["peak_kib"], text)


def main(argv: list[str]) -> int:
    """Launcher: run the command after `--` (same stdout/stderr), write its figures, pass on its exit."""
    report, sep, *cmd = argv
    if sep != "--" or not cmd:
        print("usage: python bench/child.py REPORT.json -- CMD ...", file=sys.stderr)
        return 2
    started = time.perf_counter()
    proc = subprocess.Popen(cmd)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    Path(report).write_text(json.dumps({"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "peak_kib": usage.ru_maxrss}))
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
