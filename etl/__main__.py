"""`python -m etl` is the same as the `etl` console script."""

from etl.cli import entry

entry()
