"""Command-line flags of the settings, derived from their declarations (etl.config.run_config).

A declared field with `flag=` becomes an argparse option with its choices, type and help
("doc (default X; key in a config)"). Flags default to None so that a config file's value
stands unless the flag is given. Light: `etl run --help` imports this, not pydantic.
"""

from __future__ import annotations

import argparse
import functools
import math
from typing import Any

from etl.config.fields import MIB, Declared, choices, declared, optional, show
from etl.config.run_config import RunConfig
from etl.errors import EtlError


@functools.cache
def flagged() -> dict[str, Declared]:
    """attr -> declaration, for the RunConfig fields that have a flag."""
    return {d.attr: d for d in declared(RunConfig) if d.setting.flag}


def dest(d: Declared) -> str:
    """The argparse attribute of a flag: `--max-record-mb` -> max_record_mb."""
    return str(d.setting.flag).lstrip("-").replace("-", "_")


def help_text(d: Declared, default: Any = None) -> str:
    """'doc; default X (key in a config)', the default in the flag's unit."""
    value = d.default if default is None else default
    shown = f"{value / MIB:g} MiB" if d.setting.mib else (value if isinstance(value, str) else show(value))
    # A command's own default always applies, whatever a config file says.
    where = f" ({d.setting.path} in a config)" if d.setting.path and default is None else ""
    return f"{d.setting.doc}; default {shown}{where}"


def add_flags(p: argparse.ArgumentParser, attrs: tuple[str, ...], **defaults: Any) -> None:
    """Add the flags of `attrs`; `defaults` gives a command its own default (then always applied)."""
    decls = flagged()
    for attr in attrs:
        d = decls[attr]
        inner, _ = optional(d.annotation)
        kind = float if d.setting.mib else (int if inner is int else str)
        p.add_argument(d.setting.flag, dest=dest(d), type=kind, choices=choices(d.annotation) or None,
                       default=defaults.get(attr), help=help_text(d, defaults.get(attr)))


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """RunConfig keyword arguments from the flags given (MiB flags converted to bytes).

    Raises:
        EtlError: a MiB flag that is not a positive size.
    """
    out: dict[str, Any] = {}
    for attr, d in flagged().items():
        value = getattr(args, dest(d), None)
        if value is None:
            continue
        if d.setting.mib:
            top = d.setting.limit.lt if d.setting.limit else None  # bytes, exclusive
            if not (math.isfinite(value) and value * MIB >= 1 and (top is None or value * MIB < top)):
                most = "" if top is None else f", at most {(top - 1) / MIB:g}"
                raise EtlError(f"{d.setting.flag} is {value:g}; pass a positive size in MiB{most}")
            value = int(value * MIB)
        out[attr] = value
    return out
