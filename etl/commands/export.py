"""`etl export DST OUT --format F`: write the Parquet examples in a training framework's layout.

Formats sit in `FORMATS` (name -> function); adding one (seed 004's bin / h5) is one entry.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from etl.columns import SPLITS

NAME = "export"
HELP = "Export tokenized Parquet to another layout (episodes: seed 002 tokens/mask/idx files)."


def _episodes(
    dst: Path, out: Path, *, splits: tuple[str, ...], mask: bool
) -> dict[str, dict[str, int]]:
    """Seed 002: OUT/<split>/tokens.bin (uint32), mask.bin (uint8), episodes.idx (uint64 pairs)."""
    from etl.loader.episodes import export_episodes  # numpy/pyarrow only; no torch

    return export_episodes(dst, out, splits=splits, mask=mask)


FORMATS: dict[str, Callable[..., dict[str, dict[str, int]]]] = {"episodes": _episodes}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `etl export`."""
    parser.add_argument("dst", type=Path, help="output directory of `etl run`")
    parser.add_argument("out", type=Path, help="directory to write")
    parser.add_argument("--format", required=True, choices=sorted(FORMATS), help="target layout")
    parser.add_argument(
        "--splits",
        nargs="+",
        default=list(SPLITS),
        metavar="SPLIT",
        help="splits to export (default: %(default)s); missing ones are skipped",
    )
    parser.add_argument("--no-mask", action="store_true", help="do not write the loss mask")


def run(args: argparse.Namespace) -> int:
    """Export and print one line per split written."""
    counts = FORMATS[args.format](
        args.dst, args.out, splits=tuple(args.splits), mask=not args.no_mask
    )
    for split, c in counts.items():
        print(f"{split}: {c['episodes']:,} episodes, {c['tokens']:,} tokens -> {args.out / split}")
    return 0
