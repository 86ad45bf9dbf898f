"""The `etl` command line: discovers subcommands in `etl.commands` and turns errors into one line."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import importlib
import os
import pkgutil
import re
import sys
import warnings
from types import ModuleType
from typing import Any

import etl.commands
from etl import __version__
from etl.errors import (
    EXIT_BUG,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EtlError,
    EtlWarning,
    user_message,
)


def _command_modules() -> list[ModuleType]:
    names = sorted(m.name for m in pkgutil.iter_modules(etl.commands.__path__))
    modules = [importlib.import_module(f"etl.commands.{name}") for name in names]
    return [m for m in modules if hasattr(m, "NAME") and hasattr(m, "run")]


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser, one subparser per command module; with `only`, the other commands'
    arguments are left out (`etl stats` then does not build `etl run`'s flags, which import
    pydantic and build the config models: docs/design.md, Start-up)."""
    parser = argparse.ArgumentParser(
        prog="etl",
        description="Columnar SFT data preparation: raw chats -> tokenized Parquet -> batches.",
    )
    parser.add_argument("--version", action="version", version=f"etl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _command_modules():
        p = sub.add_parser(
            module.NAME,
            help=module.HELP,
            description=getattr(module, "DESCRIPTION", module.HELP),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if only is None or module.NAME == only:
            module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


_SHOW_WARNING = warnings.showwarning
_COMMAND = ["etl"]  # the running subcommand, for warning lines


def _show_warning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    """etl's warnings as one `etl CMD: warning: ...` line each; others as Python shows them."""
    if issubclass(category, EtlWarning):
        print(f"etl {_COMMAND[0]}: warning: {message}", file=sys.stderr)
    else:
        _SHOW_WARNING(message, category, *args, **kwargs)


# numpy's `tofile` (episodes, bin shards) reports a short write as "N requested and M written",
# without an errno: a full disk, or the file size limit (Python ignores SIGXFSZ: writes past
# `ulimit -f` fail with EFBIG instead of killing the process).
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")
_NO_SPACE = ("no space left on device", "free some space or write to another disk")
_SIZE_LIMIT = ("file size limit reached (ulimit -f)", "raise it (ulimit -f unlimited) or write elsewhere")
# Why a write failed, by errno: the cause in words, and what to do about it.
_WRITE_FAILURES = {
    errno.ENOSPC: _NO_SPACE,
    errno.EDQUOT: ("disk quota exceeded", "free some of your quota or write to another disk"),
    errno.EFBIG: _SIZE_LIMIT,
    errno.EROFS: ("read-only file system", "write to another disk"),
}
_DENIED = (errno.EACCES, errno.EPERM)  # a read-only folder, or another user's: reading or writing


def _size_limited() -> bool:
    import resource  # POSIX only, and only after a failed write

    return resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY


def _write_failure(exc: OSError, args: argparse.Namespace) -> str | None:
    """The path and the cause of a failed write (a full disk, a quota, `ulimit -f`, a read-only or
    foreign folder), in one line; None for another OSError. pyarrow raises them as OSError too."""
    text = str(exc)
    where = exc.filename or getattr(args, "out", None) or getattr(args, "dst", None)
    if exc.errno in _DENIED:
        return (f"{where}: {(exc.strerror or 'permission denied').lower()}; make it (and the folder it is "
                "in) accessible to you, or choose another path")
    found = _WRITE_FAILURES.get(exc.errno)  # type: ignore[arg-type]
    if found is None and ("No space left on device" in text or _SHORT_WRITE.fullmatch(text)):
        found = _SIZE_LIMIT if _size_limited() else _NO_SPACE
    if found is None:
        return None
    cause, fix = found
    return f"{cause} while writing {where}; {fix} (the next run removes this partial output)"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `etl` console script; returns the exit status."""
    given = sys.argv[1:] if argv is None else argv
    command = next((a for a in given if not a.startswith("-")), None)
    parser = build_parser(only=command or "")
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return EXIT_ERROR
    _COMMAND[0] = args.command
    warnings.showwarning = _show_warning
    warnings.simplefilter("always", EtlWarning)
    try:
        return int(args._run(args) or EXIT_OK)
    except EtlError as exc:
        print(f"etl {args.command}: error: {user_message(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except (FileNotFoundError, IsADirectoryError) as exc:
        print(f"etl {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:  # `etl stats DST | head`: the reader left; that is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as exc:  # PermissionError included
        if (message := _write_failure(exc, args)) is None:
            return _internal_error(args.command, exc)
        print(f"etl {args.command}: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"etl {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 (EtlBug or another bug: one line, traceback on request)
        return _internal_error(args.command, exc)


def entry() -> None:
    """The `etl` console script and `python -m etl`: `main`, then an exit without the interpreter's
    teardown.

    The teardown frees every object one by one and collects the rest: after a run, both tokenizers'
    vocabularies and the modules of Polars, DuckDB and pydantic, ~0.25 s of a 2.6 s T0 20k run on
    2 cores (docs/design.md, Exit). Every file etl writes is closed and renamed before `main`
    returns (the manifest last), so once the atexit handlers have run (Ray's shutdown, logging's
    flush) and the output streams are flushed, the teardown has nothing left to save; mypy exits
    the same way. Callers of `main` (tests, scripts) keep a normal exit.
    """
    status = main()
    atexit._run_exitfuncs()  # what a normal exit runs first (CPython's own, not public API)
    with contextlib.suppress(OSError):  # a reader that left (`etl stats | head`) is not an error
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(status)


def _internal_error(command: str, exc: Exception) -> int:
    if os.environ.get("ETL_DEBUG"):
        raise exc
    print(
        f"etl {command}: internal error: {type(exc).__name__}: {exc} "
        "(set ETL_DEBUG=1 for the traceback, and please report it)",
        file=sys.stderr,
    )
    return EXIT_BUG
