"""`etl report DST -o report.html`: one self-contained HTML page with the statistics and plots."""

from __future__ import annotations

import argparse

NAME = "report"
HELP = "write a self-contained HTML report (tables + plots) of an etl output"
DESCRIPTION = """\
Write one HTML page with the statistics of an etl output: length histogram, tokens by
role (trained share), turns per example, where examples went (truncated, dropped,
rejected), and the tables of `etl stats`. Plots are PNGs embedded in the page.
A preference output gets prompt/chosen/rejected lengths, the chosen - rejected
length histogram and the length bias beside score ties; an unpaired (KTO) output
its prompt/completion lengths and label balance. An image run's output adds images
per example, the image-token share, image sizes (long side) and tokens per image.

example:
  etl report parquet/ -o report.html
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `etl report`."""
    parser.add_argument("dst", metavar="DST", help="output folder of `etl run`")
    parser.add_argument(
        "-o",
        "--output",
        default="report.html",
        metavar="FILE",
        help="HTML file to write (default: report.html)",
    )


def run(args: argparse.Namespace) -> int:
    """Render the report and say where it went."""
    # matplotlib/jinja2/duckdb: only when run, not for --help
    from etl.analysis.report import write_report

    path = write_report(args.dst, args.output)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0
