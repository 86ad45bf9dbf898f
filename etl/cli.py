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
from etl.errors import EtlError, EtlWarning


def _command_modules() -> list[ModuleType]:
    names = sorted(m.name for m in pkgutil.iter_modules(etl.commands.__path__))
    modules = [importlib.import_module(f"etl.commands.{name}") for name in names]
    return [m for m in modules if hasattr(m, "NAME") and hasattr(m, "run")]


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, one subparser per command module."""
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
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


# Exit statuses (README "Exit status"): 0 done; 1 a bug in etl; 2 a usage or input error, nothing
# (more) written; 3 done, but some input could not be read (listed in the manifest and on stderr);
# 4 `etl run` read records and wrote none (all rejected or dropped; outranks 3). etl.commands.run
# returns 3 and 4 (it cannot import this module: the import graph runs one way).
EXIT_OK, EXIT_BUG, EXIT_ERROR, EXIT_INCOMPLETE, EXIT_EMPTY = 0, 1, 2, 3, 4


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
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return EXIT_ERROR
    _COMMAND[0] = args.command
    warnings.showwarning = _show_warning
    warnings.simplefilter("always", EtlWarning)
    try:
        return int(args._run(args) or 0)

    except EtlError as exc:
        print(f"etl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        print(f"etl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `etl stats DST | head`: the reader left; that is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        if (message := _no_space(exc, args)) is None:
            return _internal_error(args.command, exc)
        print(f"etl {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"etl {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 (a bug, not a user error: one line, traceback on request)
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
