"""`etl export DST OUT --format F`: write the Parquet examples in a training framework's layout.

Formats sit in `FORMATS` (name -> function); adding one is one entry. The code is `etl.export`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from etl.columns import SPLITS
from etl.errors import EtlError

NAME = "export"
HELP = "Export tokenized Parquet to another layout (episodes: token/mask/index files; bin, h5)."


def _episodes(
    dst: Path, out: Path, *, splits: tuple[str, ...], mask: bool
) -> dict[str, dict[str, int]]:
    """The episode export: OUT/<split>/tokens.bin (uint32), mask.bin (uint8), episodes.idx
    (uint64 pairs)."""
    # Deferred: `etl --help` imports every command module and needs no numpy or pyarrow.
    from etl.export.episodes import export_episodes  # numpy/pyarrow only; no torch

    return export_episodes(dst, out, splits=splits, mask=mask)


def _storage(storage_format: str) -> Callable[..., dict[str, dict[str, int]]]:
    """The bin/h5 export: OUT/<domain>/meta.json + int64 token files (etl.export.token_files)."""

    def export(
        dst: Path,
        out: Path,
        *,
        splits: tuple[str, ...],
        mask: bool,
        max_tokens_per_shard: int | None,
    ) -> dict[str, dict[str, int]]:
        # Deferred as in `_episodes`.
        from etl.export.token_files import (
            DEFAULT_MAX_TOKENS_PER_SHARD,
            domain_folder,
            export_storage,
        )

        # pyarrow: only when run, not for --help
        from etl.output.parts import listed_splits

        # The bin/h5 layout has no splits: one split per OUT, the first requested one that exists.
        present = listed_splits(dst)
        have = [s for s in splits if s in present] or list(splits[:1])
        if len(have) > 1:
            print(
                f"{storage_format} holds one split: {have[0]}; for {have[1:]} run again "
                "with --splits NAME and another OUT",
                file=sys.stderr,
            )
        counts = export_storage(
            dst,
            out,
            storage_format=storage_format,
            split=have[0],
            max_tokens_per_shard=DEFAULT_MAX_TOKENS_PER_SHARD
            if max_tokens_per_shard is None
            else max_tokens_per_shard,
        )  # bin/h5 always has loss_mask: --no-mask is for episodes only
        return {
            domain_folder(d): {"episodes": c["sequences"], "tokens": c["tokens"]}
            for d, c in counts.items()
        }

    return export


FORMATS: dict[str, Callable[..., dict[str, dict[str, int]]]] = {
    "episodes": _episodes,
    "bin": _storage("bin"),
    "h5": _storage("h5"),
}


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
    parser.add_argument(
        "--max-tokens-per-shard",
        type=int,
        metavar="N",
        help="bin/h5: tokens per shard (default: 100M); bin/h5 write the first split",
    )


def run(args: argparse.Namespace) -> int:
    """Export and print one line per split written."""
    if args.out.exists() and not args.out.is_dir():
        raise EtlError(f"OUT {args.out} is a file; pass a folder to export into")
    if args.max_tokens_per_shard is not None and args.max_tokens_per_shard < 1:
        raise EtlError(f"--max-tokens-per-shard must be >= 1, got {args.max_tokens_per_shard}")
    _refuse_pairs(args.dst)
    extra = {"max_tokens_per_shard": args.max_tokens_per_shard} if args.format != "episodes" else {}
    counts = FORMATS[args.format](
        args.dst, args.out, splits=tuple(args.splits), mask=not args.no_mask, **extra
    )
    for split, c in counts.items():
        print(f"{split}: {c['episodes']:,} episodes, {c['tokens']:,} tokens -> {args.out / split}")
    return 0


def _refuse_pairs(dst: Path) -> None:
    """Every format is an SFT token stream (input_ids + loss_mask): refuse pairs before OUT is touched."""
    # pyarrow: only when run, not for --help
    from etl.columns import MANIFEST_KIND
    from etl.kinds import KINDS, SFT
    from etl.output.manifest import read_manifest

    kind = KINDS[read_manifest(dst).get(MANIFEST_KIND, SFT)]
    if kind.pair:
        raise EtlError(f"{dst} holds {kind.rows}, and export writes SFT token streams (input_ids + loss_mask) only; train on the Parquet "
                       "itself: ParquetLoader(DST), or datasets.load_dataset(DST) for TRL")
