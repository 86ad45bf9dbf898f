"""Turn command-line flags (and, later, a config file) into a `RunConfig`."""

from __future__ import annotations

import argparse
import dataclasses

from etl.config import RunConfig


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """Defaults < config file < flags."""
    overrides: dict[str, object] = {}
    for flag, name in (("tokenizer", "tokenizer"), ("template", "template"), ("seq_len", "seq_len")):
        value = getattr(args, flag, None)
        if value is not None:
            overrides[name] = value
    if getattr(args, "no_default_system", False):
        overrides["default_system"] = None
    if getattr(args, "chunk_mb", None):
        overrides["chunk_bytes"] = int(args.chunk_mb * (1 << 20))
    return dataclasses.replace(RunConfig(), **overrides)
