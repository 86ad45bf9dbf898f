"""`etl stats DST`: run the DuckDB queries of `sql/` over an etl output and print the tables."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from etl.errors import EtlError
from etl.ui.console import console as Console

NAME = "stats"
HELP = "token statistics of an etl output (DuckDB queries in sql/)"
DESCRIPTION = """\
Token statistics of an etl output: lengths, trained share, roles, domains, drops and
rejects, packing estimate, the pack index of `etl pack` (utilization per split and
strategy), and row listings of suspicious examples. Each table is one
DuckDB query in sql/<name>.sql. A preference output (the manifest's kind) gets
its own tables from sql/preference/: pairs and tokens, prompt/chosen/rejected
lengths, how often chosen is longer, score ties, truncation; an unpaired (KTO)
output: label balance and prompt/completion lengths. An image run's output (etl run
--tokenizer on a processor folder) also gets images per example, the image-token share,
image sizes (long side) and tokens per image.

examples:
  etl stats parquet/
  etl stats parquet/ --query lengths --format json
  etl stats parquet/ --query packing --seq-len 2048 --seq-len 4096 --format csv
  etl stats parquet/ --query packs          # after `etl pack parquet/ --strategy bfd`
  etl stats pairs/ --query length_bias      # a preference output
  etl stats vl-out/ --query images --query image_sizes   # an image run's output
"""

FORMATS = ("table", "json", "csv")
# What an empty table means where "(no rows)" would not say it.
EMPTY_NOTES = {"packs": "(no pack index: `etl pack DST --strategy bfd` writes one)"}
# Histogram tables -> their count column, drawn as text bars.
HISTOGRAMS = {
    "length_histogram": "examples",
    "part_length_histogram": "rows",
    "length_difference": "pairs",
    "images_per_example": "examples",
    "image_share_histogram": "examples",
    "image_sizes": "images",
    "image_tokens": "images",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `etl stats`."""
    parser.add_argument("dst", metavar="DST", help="output folder of `etl run`")
    parser.add_argument(
        "--query",
        action="append",
        metavar="NAME",
        help="run only this query (repeatable); default: all. `--query list` prints the names",
    )
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format")
    parser.add_argument(
        "--seq-len",
        action="append",
        type=int,
        metavar="N",
        help="sequence length(s) of the packing estimate (repeatable); default: the run's S",
    )
    parser.add_argument(
        "--bin-width",
        type=int,
        metavar="N",
        help="tokens per length-histogram bin; default: ceil(S / 32)",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=100,
        metavar="N",
        help="rows shown per table in the table format (0: all); default 100",
    )


def run(args: argparse.Namespace) -> int:
    """Run the queries and print them in the chosen format."""
    # duckdb/pyarrow: only when run, not for --help
    from etl.analysis.stats import query_names, run_queries

    if args.query == ["list"]:
        kind, images = _kind(args.dst)
        print("\n".join(query_names(kind, images=images)))
        return 0
    if args.format == "csv" and len(args.query or []) != 1:
        raise EtlError("--format csv prints one table: add --query NAME (see --query list)")
    tables = run_queries(args.dst, args.query, seq_lens=args.seq_len, bin_width=args.bin_width)
    if args.format == "json":
        _print_json(tables)
    elif args.format == "csv":
        _print_csv(next(iter(tables.values())))
    else:
        _print_tables(tables, limit=args.limit)
    return 0


def _kind(dst: str) -> tuple[str, bool]:
    """The output's kind for `--query list`, and whether an image run wrote it; ("sft", False)
    where DST is no readable output (the list needs no data)."""
    # pyarrow (via etl.output): only when run, not for --help
    from etl.analysis.pair_stats import output_kind
    from etl.analysis.stats import image_block
    from etl.kinds import SFT
    from etl.output.manifest import read_manifest

    try:
        manifest = read_manifest(dst)
        return output_kind(manifest), image_block(manifest) is not None
    except (EtlError, OSError, ValueError):
        return SFT, False


def _print_json(tables: dict[str, Any]) -> None:
    records = {name: table.to_pylist() for name, table in tables.items()}
    # One query: a bare list of rows, what `jq '.[]'` and pandas.read_json expect.
    payload = next(iter(records.values())) if len(records) == 1 else records
    print(json.dumps(payload, indent=2, default=str))


def _print_csv(table: Any) -> None:
    # pyarrow: only when run, not for --help
    import pyarrow.csv as pcsv

    pcsv.write_csv(table, sys.stdout.buffer)
    sys.stdout.buffer.flush()


def _print_tables(tables: dict[str, Any], *, limit: int) -> None:
    # pyarrow and rich: only when run, not for --help
    import pyarrow as pa
    from rich.table import Table

    # Piped output gets a wide fixed width: rich's default of 80 squeezes 10-column tables.
    console = Console(width=None if sys.stdout.isatty() else 200)
    for name, table in tables.items():
        shown = table if limit <= 0 else table.slice(0, limit)
        view = Table(title=name, title_justify="left", title_style="bold")
        for field in table.schema:
            numeric = pa.types.is_integer(field.type) or pa.types.is_floating(field.type)
            view.add_column(field.name, justify="right" if numeric else "left")
        bars = _bars(shown, HISTOGRAMS[name]) if name in HISTOGRAMS else None
        if bars:
            view.add_column("", style="cyan")
        for i, row in enumerate(shown.to_pylist()):
            view.add_row(*(_cell(v) for v in row.values()), *([bars[i]] if bars else []))
        console.print(view)
        if shown.num_rows < table.num_rows:
            console.print(
                f"[dim]… {table.num_rows - shown.num_rows} more rows: "
                f"--limit 0, or --query {name} --format csv[/dim]"
            )
        if table.num_rows == 0:
            console.print(f"[dim]{EMPTY_NOTES.get(name, '(no rows)')}[/dim]")


def _bars(table: Any, column: str, width: int = 40) -> list[str]:
    """A text bar per histogram row, scaled to the largest bin (a plot in the terminal)."""
    counts = table.column(column).to_pylist()
    top = max(counts, default=0)
    return [("█" * max(1, round(width * n / top)) if n else "") for n in counts] if top else []


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 10 else f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
