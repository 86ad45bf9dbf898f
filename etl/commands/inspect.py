"""`etl inspect DST --row N`: one example token by token, trained tokens highlighted (`--pack N`:
one packed row of the pack index, a marker line per piece)."""

from __future__ import annotations

import argparse
import sys

from etl.columns import MANIFEST_KIND
from etl.errors import EtlError
from etl.kinds import KINDS, SFT
from etl.output.manifest import read_manifest
from etl.ui.console import console as Console

NAME = "inspect"
HELP = "show one example token by token with its loss mask and turn boundaries"
DESCRIPTION = """\
Show one example of an etl output as text, token by token: trained tokens (loss_mask)
highlighted, special tokens in magenta, a marker line where each kept turn starts. In an
image run's example each image's tokens show as one label, e.g.
<image 1: 640x427 -> grid 1x30x46, 345 tokens> (its size, grid and image tokens).
With --pack N: packed row N of the pack index (`etl pack`), a marker line where each
piece starts (example id, row, token range), trained = loss_mask and the piece's flag.
On a terminal tokens alternate shades so their boundaries show; --plain (the default
when output is not a terminal) wraps runs of trained tokens in [[...]] instead.

examples:
  etl inspect parquet/ --row 0
  etl inspect parquet/ --row 3 --split val --plain --token-sep '|'
  etl inspect parquet/ --id 9f2c... | less
  etl inspect parquet/ --pack 0 --plain      # after `etl pack parquet/ --strategy bfd`
  etl inspect parquet/ --row 0 --tokenizer ~/models/qwen2.5   # run's tokenizer moved
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `etl inspect`."""
    parser.add_argument("dst", metavar="DST", help="output folder of `etl run`")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--row", type=int, metavar="N", help="0-based row in the split")
    which.add_argument("--id", dest="example_id", metavar="ID", help="the example's id")
    which.add_argument("--pack", type=int, metavar="N", help="0-based pack of the pack index (etl pack)")
    parser.add_argument("--split", default="train", help="split to read (default: train)")
    style = parser.add_mutually_exclusive_group()
    style.add_argument(
        "--plain",
        action="store_true",
        help="plain text, trained runs in [[...]] (default when piped)",
    )
    style.add_argument("--color", action="store_true", help="rich styles even when piped")
    parser.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="the run's tokenizer (tokenizer.json or model directory) when the path in the "
        "manifest does not load here; its sha256 must match the manifest's",
    )
    parser.add_argument(
        "--token-sep",
        default="",
        metavar="STR",
        help="plain mode: string written between tokens, e.g. '|'",
    )


def run(args: argparse.Namespace) -> int:
    """Read the example and its turns (or the pack and its pieces), and print them."""
    # pyarrow/rich: only when run, not for --help
    from etl.analysis.inspect_example import (
        image_span_ids,
        read_example,
        read_turns,
        render_plain,
        render_rich,
        token_strings,
    )

    for flag, value in (("--row", args.row), ("--pack", args.pack)):
        if value is not None and value < 0:
            raise EtlError(f"{flag} must be 0 or more, got {value}")
    manifest = read_manifest(args.dst)
    plain = args.plain or not (args.color or sys.stdout.isatty())
    special = {int(i) for i in (manifest.get("special_ids") or {}).values()}
    kind = manifest.get(MANIFEST_KIND, SFT)
    if args.pack is not None and KINDS[kind].pair:
        # A pair pack lays out prompt, chosen and rejected with positions and attention of its own:
        # the loader builds those (etl.loader.pairs.pack), and --pack renders SFT rows only.
        raise EtlError(f"--pack shows packed SFT rows, and {args.dst} holds {kind} rows; `etl inspect "
                       f"{args.dst} --row N` shows one of them, and ParquetLoader(DST, packing=...) gives "
                       "their packed batches")
    if args.pack is not None:
        # pyarrow/rich: only for a pack index
        from etl.analysis.inspect_pack import read_pack, render_pack_plain, render_pack_rich

        pack = read_pack(args.dst, split=args.split, pack=args.pack)
        strings = token_strings(manifest, pack["input_ids"], tokenizer=args.tokenizer)
        if plain:
            sys.stdout.write(render_pack_plain(pack, strings, token_sep=args.token_sep))
            return 0
        return _print_rich(render_pack_rich(pack, strings, special_ids=special), color=args.color)
    example = read_example(args.dst, split=args.split, row=args.row, example_id=args.example_id)
    if not KINDS[kind].pair:
        turns = read_turns(args.dst, split=args.split, example_id=example["id"])
    else:  # a pair or an unpaired completion: its parts as turns of one example
        from etl.analysis.inspect_pair import as_example

        example, turns = as_example(example, kind)
    strings = token_strings(manifest, example["input_ids"], tokenizer=args.tokenizer)
    spans = image_span_ids(manifest)  # an image run: each image's tokens show as one label
    if plain:
        text = render_plain(example, turns, strings, token_sep=args.token_sep, image_span_ids=spans)
        sys.stdout.write(text)
        return 0
    rich = render_rich(example, turns, strings, special_ids=special, image_span_ids=spans)
    return _print_rich(rich, color=args.color)


def _print_rich(parts: list[object], *, color: bool) -> int:
    console = Console(force_terminal=True if color else None, highlight=False)
    for part in parts:
        console.print(part)
    return 0
