"""The `etl` command line: discovers subcommands in `etl.commands` and turns errors into one line."""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from types import ModuleType

import etl.commands
from etl import __version__
from etl.errors import EtlError


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


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `etl` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
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
    except KeyboardInterrupt:
        print(f"etl {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not a user error: one line, the traceback on request
        if os.environ.get("ETL_DEBUG"):
            raise
        print(
            f"etl {args.command}: internal error: {type(exc).__name__}: {exc} "
            "(set ETL_DEBUG=1 for the traceback, and please report it)",
            file=sys.stderr,
        )
        return 1
