"""A rich Console for command output that treats a closed pipe (`etl stats DST | head`) as done."""

from __future__ import annotations

import os
import sys
from typing import Any


def console(**kwargs: Any) -> Any:
    """A `rich.console.Console` whose broken pipe reaches the CLI as `BrokenPipeError` (exit 0).

    rich's own handler exits with status 1, which fails `set -o pipefail` scripts although the
    reader simply stopped early.
    """
    # rich (~70 modules): only when a command prints with it
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise BrokenPipeError

    return PipeConsole(**kwargs)
