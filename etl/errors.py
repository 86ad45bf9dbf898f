"""The exceptions etl raises on purpose, and the exit statuses of the `etl` command.

`EtlError` is the one exception type users see: its message says how to fix the problem.
`EtlBug` is an internal fault (an invariant of etl's own data broke): the CLI reports it as
a bug, not as a usage error.
"""

from __future__ import annotations

# Exit statuses (docs/outputs.md "Exit status"): 0 done; 1 a bug in etl; 2 a usage or input error, nothing
# (more) written; 3 done, but some input could not be read (listed in the manifest and on stderr);
# 4 `etl run` read records and wrote none (all rejected or dropped; outranks 3); 130 interrupted
# (Ctrl-C, as a shell reports SIGINT: 128 + 2).
EXIT_OK, EXIT_BUG, EXIT_ERROR, EXIT_INCOMPLETE, EXIT_EMPTY = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130


class EtlError(Exception):
    """A user-facing error: the CLI prints its message on one line and exits with EXIT_ERROR."""


class EtlBug(RuntimeError):
    """A fault inside etl, not the user's: the CLI exits with EXIT_BUG and asks for a report."""


class EtlWarning(UserWarning):
    """Something the user should know that does not stop the work (an unlisted part, a salvaged
    file); the CLI prints it as one `etl CMD: warning: ...` line."""


# Polars appends this to the message of an exception raised inside an expression's Python function
# (`map_batches`): where the error happened in Polars' plan, noise to an etl user.
POLARS_TRAILER = "\n\nThis error occurred in the following expression:"


def user_message(exc: BaseException) -> str:
    """An exception's message, without what Polars appended to it."""
    return str(exc).split(POLARS_TRAILER, 1)[0]
