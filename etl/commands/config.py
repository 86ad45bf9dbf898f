"""`etl config [--schema]`: the config file's keys as a table, or its JSON Schema for editors."""

from __future__ import annotations

import argparse
import json
import sys

NAME = "config"
HELP = "print the config file's keys (a Markdown table), or with --schema its JSON Schema"
DESCRIPTION = """\
Print every key an `etl run --config` file may hold (the declarative pipeline schema plus etl's
sections): its type or allowed values, default, overriding flag and meaning. With --schema,
print the file's JSON Schema (draft 2020-12) instead, for editors to complete and check config
files: save it and point a JSON file's "$schema" key at it (docs/config.md).

examples:
  etl config
  etl config --schema > etl-config.schema.json
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `etl config`."""
    p.add_argument("--schema", action="store_true", help="print the JSON Schema of a config file")


def run(args: argparse.Namespace) -> int:
    """Print the table or the schema; exit 0."""
    from etl.config.schema import json_schema, markdown_table  # pydantic and DuckDB: only when run

    if args.schema:
        json.dump(json_schema(), sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(markdown_table())
    return 0
