"""`etl pack DST --seq-len N --strategy S`: write the pack index DST/packs (no tokens copied)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from etl.columns import CUT_SIDES, PACK_STRATEGIES, PACKS_DIR, PACKS_FILE, check_seq_len
from etl.errors import EtlError
from etl.output.manifest import read_manifest

NAME = "pack"
HELP = "pack examples into rows of at most S tokens: the pack index DST/packs"
DESCRIPTION = """\
Pack the examples of an etl output into rows of at most N tokens and write the pack index
DST/packs/<split>/part-*.parquet: one row per pack with the example ids, rows, token offsets
and lengths of its pieces. Only lengths are read and no token is copied; the loader reads the
index (ParquetLoader(..., packing=STRATEGY)), `etl stats --query packs` reports it and
`etl inspect DST --pack N` shows one pack. A new `etl pack` replaces the previous index; a new
`etl run` removes it.

strategies:
  bfd         best-fit decreasing: every example whole, the fewest packs (default choice)
  ffd         first-fit decreasing: every example whole, chomp's bin packer
  sequential  chomp-style: one token stream cut every N tokens (examples split across packs)
  stream      stream packing with block-boundary injection of system span and user header

examples:
  etl pack parquet/ --strategy bfd
  etl pack parquet/ --strategy bfd --seq-len 4096 --split train
  etl pack parquet/ --strategy ffd --buffer-docs 1000 --max-docs-per-bin 16
  etl pack parquet/ --strategy sequential --seq-len 2048
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `etl pack`."""
    parser.add_argument("dst", type=Path, metavar="DST", help="output folder of `etl run`")
    parser.add_argument("--strategy", required=True, choices=PACK_STRATEGIES, help="packing strategy")
    parser.add_argument("--seq-len", type=int, metavar="N",
                        help="S, the most tokens of a pack (default: the run's seq_len)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the packer (default 0)")
    parser.add_argument("--split", action="append", metavar="NAME",
                        help="split to pack (repeatable; default: every split present)")
    parser.add_argument("--buffer-docs", type=int, metavar="N",
                        help="bfd/ffd: pack windows of N examples (default: the whole split)")
    parser.add_argument("--max-docs-per-bin", type=int, metavar="N",
                        help="bfd/ffd: at most N examples per pack (default: no cap)")
    parser.add_argument("--truncation", choices=CUT_SIDES, default="right",
                        help="bfd/ffd: an example longer than N keeps its first (right) or last "
                        "(left) N tokens (default right); sequential and stream split it instead")


def _options(args: argparse.Namespace) -> dict[str, int]:
    """The packer knobs given, checked against the strategy."""
    given = {"buffer_docs": args.buffer_docs, "max_docs_per_bin": args.max_docs_per_bin}
    given = {k: v for k, v in given.items() if v is not None}
    for key, value in given.items():
        flag = "--" + key.replace("_", "-")
        if args.strategy not in ("bfd", "ffd"):
            raise EtlError(f"{flag} applies to --strategy bfd or ffd, not {args.strategy}")
        if value < 1:
            raise EtlError(f"{flag} must be at least 1, got {value}")
    return given


def run(args: argparse.Namespace) -> int:
    """Pack every split asked, write the index, print one line per split."""
    # pyarrow/numpy: only when run, not for --help
    from etl.output.parts import listed_splits
    from etl.packing.index import build_pack_index
    from etl.packing.index_io import write_pack_index

    manifest = read_manifest(args.dst)  # not an etl output: one line saying to run `etl run`
    options = _options(args)
    seq_len = args.seq_len if args.seq_len is not None else int(manifest.get("seq_len") or 0)
    check_seq_len(seq_len, "--seq-len")
    present = listed_splits(args.dst, manifest)
    splits = list(dict.fromkeys(args.split or present))
    if missing := [s for s in splits if s not in present]:
        raise EtlError(f"no split {', '.join(missing)} in {args.dst}: splits present are "
                       f"{', '.join(present) or 'none (the run wrote no examples)'}")
    indexes, seconds = {}, {}
    for split in splits:
        started = time.perf_counter()
        indexes[split] = build_pack_index(args.dst, split, strategy=args.strategy, seq_len=seq_len,
                                          seed=args.seed, truncation=args.truncation, **options)
        seconds[split] = time.perf_counter() - started
        if clipped := indexes[split].clipped:
            kept = "first" if args.truncation == "right" else "last"
            print(f"etl pack: warning: {split}: examples longer than {seq_len:,} tokens: {clipped:,}; "
                  f"they keep their {kept} {seq_len:,} (--truncation; or pack with a larger --seq-len, "
                  "or --strategy sequential to split them)", file=sys.stderr)
        if (skipped := indexes[split].skipped_tokens) and args.strategy == "stream":
            total = indexes[split].example_tokens
            print(f"etl pack: warning: {split}: skipped {skipped:,} of {total:,} tokens ({skipped / total:.1%}): "
                  f"no pack holds them (stream_utilization in {PACKS_FILE}); use a larger --seq-len",
                  file=sys.stderr)
    started = time.perf_counter()
    write_pack_index(args.dst, indexes)
    write = (time.perf_counter() - started) / max(1, len(indexes))  # one writer for all splits
    for split, index in indexes.items():
        print(f"{split}: {index.packing.num_packs:,} packs, utilization "
              f"{index.packing.utilization(seq_len):.4f}, {seconds[split] + write:.1f} s "
              f"-> {args.dst / PACKS_DIR / split}")
    return 0
