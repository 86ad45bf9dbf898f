"""The `etl` command line: discovers subcommands in `etl.commands` and turns errors into one line."""

from __future__ import annotations

import argparse
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
    pydantic: ~80 ms of every start)."""
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
# without an errno: on a local disk that is a full one (a file-size ulimit kills with SIGXFSZ first).
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")


def _no_space(exc: OSError, args: argparse.Namespace) -> str | None:
    """'no space left on device' and where, for a full disk (pyarrow raises it as OSError too)."""
    text = str(exc)
    if exc.errno != errno.ENOSPC and "No space left on device" not in text and not _SHORT_WRITE.fullmatch(text):
        return None
    where = exc.filename or getattr(args, "out", None) or getattr(args, "dst", None)
    return (f"no space left on device while writing {where}; free some space or write to another "
            "disk (the next run removes this partial output)")


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
    except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        print(f"etl {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:  # `etl stats DST | head`: the reader left; that is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as exc:
        if (message := _no_space(exc, args)) is None:
            return _internal_error(args.command, exc)
        print(f"etl {args.command}: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"etl {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 (EtlBug or another bug: one line, traceback on request)
        return _internal_error(args.command, exc)


def _internal_error(command: str, exc: Exception) -> int:
    if os.environ.get("ETL_DEBUG"):
        raise exc
    print(
        f"etl {command}: internal error: {type(exc).__name__}: {exc} "
        "(set ETL_DEBUG=1 for the traceback, and please report it)",
        file=sys.stderr,
    )
    return EXIT_BUG
