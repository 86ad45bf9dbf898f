"""The one exception type users see: `EtlError` carries a message that says how to fix the problem."""

from __future__ import annotations


class EtlError(Exception):
    """A user-facing error: the CLI prints its message on one line and exits non-zero."""


class EtlWarning(UserWarning):
    """Something the user should know that does not stop the work (an unlisted part, a salvaged
    file); the CLI prints it as one `etl CMD: warning: ...` line."""
