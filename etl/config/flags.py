"""Command-line flags of the settings, derived from their declarations (etl.config.run_config).

A RunConfig field with a flag is an argparse option with its choices, type and help ("doc;
default X (key in a config)"). Flags default to None, so that a config file's value stands
unless the flag is given.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from etl.config.declare import MIB, choices, declared, optional, show
from etl.config.run_config import RunConfig
from etl.errors import EtlError

# attr -> (field, key) of the RunConfig fields that have a flag.
FLAGGED = {attr: (info, k) for attr, info, k in declared(RunConfig) if k.flag}


def _dest(flag: str | None) -> str:
    return str(flag).lstrip("-").replace("-", "_")  # `--max-record-mb` -> max_record_mb


def add_flags(p: argparse.ArgumentParser, attrs: tuple[str, ...], **defaults: Any) -> None:
    """Add the flags of `attrs`; `defaults` gives a command its own default (then always applied)."""
    for attr in attrs:
        info, k = FLAGGED[attr]
        default = defaults.get(attr, info.default)
        shown = f"{default / MIB:g} MiB" if k.mib else (default if isinstance(default, str) else show(default))
        where = f" ({k.path} in a config)" if k.path and attr not in defaults else ""
        kind = float if k.mib else (int if optional(info.annotation)[0] is int else str)
        p.add_argument(k.flag, dest=_dest(k.flag), type=kind,
                       choices=choices(info.annotation) or None, default=defaults.get(attr),
                       help=f"{info.description}; default {shown}{where}")


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """RunConfig keyword arguments from the flags given (MiB flags converted to bytes).

    Raises:
        EtlError: a MiB flag that is not a positive size.
    """
    out: dict[str, Any] = {}
    for attr, (info, k) in FLAGGED.items():
        value = getattr(args, _dest(k.flag), None)
        if value is not None and k.mib:
            top = next((m.lt for m in info.metadata if hasattr(m, "lt")), math.inf)  # bytes, exclusive
            if not (math.isfinite(value) and 1 <= value * MIB < top):
                most = "" if top == math.inf else f", at most {(top - 1) / MIB:g}"
                raise EtlError(f"{k.flag} is {value:g}; pass a positive size in MiB{most}")
            value = int(value * MIB)
        if value is not None:
            out[attr] = value
    return out
