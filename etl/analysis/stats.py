"""Token statistics of an etl output: run the DuckDB queries of `sql/` over DST, get Arrow tables.

One query per file `sql/<name>.sql`; preference and unpaired outputs (the manifest's `kind`) get
the query set of `etl.analysis.pair_stats` (`sql/preference/`). Inputs are bound, never formatted
in: `$data`, `$turns`, `$rejects`, `$packs` (lists of Parquet files), `$manifest`,
`$packs_record` (paths of `_manifest.json`, `_packs.json`), `$bin_width`, `$seq_lens`. A query
receives exactly the parameters it names (DuckDB rejects extra ones). The image queries
(`IMAGE_QUERIES`) read the columns only image runs write: they are listed for those alone.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from etl import columns as C
from etl.analysis.pair_stats import output_kind, query_file
from etl.errors import EtlError
from etl.kinds import KINDS, SFT
from etl.output.manifest import read_manifest
from etl.output.parquet import DATA_SCHEMA, KIND_SCHEMAS, REJECTS_SCHEMA, TURNS_SCHEMA, data_schema
from etl.output.parts import listed_parts, listed_splits
from etl.packing.index import PACKS_SCHEMA
from etl.packing.index_io import pack_files, read_record

# sql/ is the repository's top-level folder; etl/sql links to it so wheels ship the queries too.
# ETL_SQL_DIR overrides it.
SQL_DIR = Path(os.environ.get("ETL_SQL_DIR", Path(__file__).resolve().parents[1] / "sql"))

# The queries of image runs' outputs (the manifest has an `images` block): they read the image
# columns (docs/images.md, What is written), which text runs lack, so text runs never list them.
IMAGE_QUERIES = ("images", "images_per_example", "image_share_histogram", "image_sizes", "image_tokens")
MANIFEST_IMAGES = "images"  # the manifest's block of an image run: the processor's rule, span_ids

# Display order of `etl stats` and the report: summaries first, row listings last.
QUERY_ORDER = (
    "lengths",
    "length_histogram",
    "trained_share",
    "turns_per_example",
    *IMAGE_QUERIES,
    "roles",
    "domains",
    "mixture",
    "drops",
    "rejects",
    "packing",
    "packs",
    "consistency",
    "zero_trained",
    "untrained_eot",
)

HISTOGRAM_BINS = 32  # default bin width = ceil(seq_len / 32): ~32 bars up to seq_len

_PARAM = re.compile(r"\$([a-z_][a-z0-9_]*)")
_COMMENT = re.compile(r"--[^\n]*")

# Zero-row stand-ins for absent file groups (e.g. a run with no rejects): read_parquet([]) is an
# error in DuckDB, an empty file with the contract schema is the honest "nothing here".
_EMPTY_SCHEMAS = {"data": DATA_SCHEMA, "turns": TURNS_SCHEMA, "rejects": REJECTS_SCHEMA, "packs": PACKS_SCHEMA}


def image_block(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest's `images` block: present for an image run's output, None for a text run's."""
    block = manifest.get(MANIFEST_IMAGES)
    return block if isinstance(block, dict) else None


def query_names(kind: str = SFT, *, images: bool = False) -> list[str]:
    """Names of the queries for an output of `kind` in display order (SFT: the `sql/*.sql` stems;
    `IMAGE_QUERIES` only with `images`, an image run's output)."""
    if not SQL_DIR.is_dir():
        raise EtlError(
            f"query folder {SQL_DIR} not found: install etl editable from its repository "
            "(pip install -e .) or set ETL_SQL_DIR to the repository's sql/ folder"
        )
    if queries := KINDS[kind].queries:
        return list(queries)
    found = {p.stem for p in SQL_DIR.glob("*.sql")} - set(() if images else IMAGE_QUERIES)
    known = [n for n in QUERY_ORDER if n in found]
    return known + sorted(found - set(known))


def load_query(name: str, kind: str = SFT, *, images: bool = False) -> str:
    """The SQL text of query `name` for an output of `kind` (`images`: an image run's).

    Raises:
        EtlError: when the output has no query `name`; the message lists the valid names.
    """
    names = query_names(kind, images=images)
    if name not in names:
        of = f" for a {kind} output" if KINDS[kind].pair else ""
        if name in IMAGE_QUERIES and not images:
            of = " for an output without images (`etl run --tokenizer` on a processor folder writes them)"
        raise EtlError(f"unknown query {name!r}{of}: choose one of {', '.join(names)}")
    return (SQL_DIR / query_file(name, kind)).read_text(encoding="utf-8")


def _query_parameters(sql: str) -> set[str]:
    """The `$name` parameters a query uses (comments ignored)."""
    return set(_PARAM.findall(_COMMENT.sub("", sql)))


def input_files(dst: str | os.PathLike[str], manifest: dict[str, Any] | None = None) -> dict[str, list[str]]:
    """The Parquet files the manifest lists per group (`data`, `turns`, `rejects`), checked.

    sha256 too: DuckDB does not verify Parquet page checksums, and hashing costs less than the
    queries read on most outputs (docs/outputs.md).
    """
    manifest = manifest if manifest is not None else read_manifest(dst)
    splits = listed_splits(dst, manifest)

    def group(folders: list[str]) -> list[str]:
        return [str(p) for f in folders for p in listed_parts(dst, f, manifest=manifest, checksum=True)]

    return {
        "data": group([f"{C.DATA_DIR}/{s}" for s in splits]),
        "turns": group([f"{C.TURNS_DIR}/{s}" for s in splits]),
        "rejects": group([C.REJECTS_DIR]),
    }


def _pack_inputs(dst: str | os.PathLike[str], manifest: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """`$packs` (the pack index parts, each checked, of splits whose data they still match) and
    `$packs_record` (`_packs.json`); zero-row stand-ins when DST has no pack index."""
    record = read_record(dst)
    splits = sorted((record or {}).get("splits", {}))
    files = [str(p) for s in splits for p in pack_files(dst, s, record, manifest)]  # type: ignore[arg-type]
    if record is None:
        (tmp / "empty-packs.json").write_text('{"splits": {}}', encoding="utf-8")
    return {
        "packs": files or [_empty_parquet(tmp, "packs")],
        "packs_record": str(Path(dst) / C.PACKS_FILE) if record is not None else str(tmp / "empty-packs.json"),
    }


def default_bin_width(seq_len: int) -> int:
    """Histogram bin width for a given S: about `HISTOGRAM_BINS` bins up to S."""
    return max(1, math.ceil(seq_len / HISTOGRAM_BINS))


def run_queries(
    dst: str | os.PathLike[str],
    names: Sequence[str] | None = None,
    *,
    seq_lens: Sequence[int] | None = None,
    bin_width: int | None = None,
    threads: int | None = None,
) -> dict[str, pa.Table]:
    """Run queries over an etl output.

    Args:
        dst: the output folder of `etl run` (holds `_manifest.json`).
        names: queries to run; all of the output's kind (display order) when None.
        seq_lens: target lengths S of the packing estimate; the manifest's seq_len when None.
        bin_width: tokens per histogram bin; `default_bin_width(seq_len)` when None.
        threads: DuckDB threads; DuckDB's default (all cores) when None.

    Returns:
        Query name -> result table, in the order asked.

    Raises:
        EtlError: DST is not a finished output, a name is unknown, an argument is out of range,
            or a query fails on files that do not follow the layout.
    """
    import duckdb  # only the stats/report paths need it (docs/design.md, Imports)

    manifest = read_manifest(dst)
    kind, images = output_kind(manifest), image_block(manifest) is not None
    names = names or query_names(kind, images=images)
    texts = {name: load_query(name, kind, images=images) for name in names}
    seq_len = int(manifest.get("seq_len") or C.DEFAULT_SEQ_LEN)
    values: dict[str, Any] = {
        "manifest": str(Path(dst) / C.MANIFEST_FILE),
        "seq_lens": [int(s) for s in (seq_lens or [seq_len])],
        "bin_width": int(bin_width if bin_width is not None else default_bin_width(seq_len)),
    }
    if values["bin_width"] < 1 or min(values["seq_lens"]) < 1:
        raise EtlError("--bin-width and --seq-len must be positive integers")
    con = duckdb.connect(config={"threads": threads} if threads else {})
    with tempfile.TemporaryDirectory(prefix="etl-stats-") as tmp:
        for group, files in input_files(dst, manifest).items():
            values[group] = files or [_empty_parquet(Path(tmp), group, kind, images=images)]
        if any({"packs", "packs_record"} & _query_parameters(sql) for sql in texts.values()):
            values.update(_pack_inputs(dst, manifest, Path(tmp)))
        try:
            return {name: _execute(con, name, sql, values) for name, sql in texts.items()}
        finally:
            con.close()


def run_query(dst: str | os.PathLike[str], name: str, **options: Any) -> pa.Table:
    """Run one query; `options` are those of `run_queries`."""
    return run_queries(dst, [name], **options)[name]


def _execute(con: Any, name: str, sql: str, values: dict[str, Any]) -> pa.Table:
    # duckdb: only the stats/report queries need it
    import duckdb

    used = _query_parameters(sql)
    assert used <= set(values), f"{name}.sql uses unknown parameters {used - set(values)}"
    params = {key: values[key] for key in used}
    try:
        return con.sql(sql, params=params).to_arrow_table()
    except duckdb.Error as exc:
        first = str(exc).strip().splitlines()[0]
        raise EtlError(
            f"query {name!r} failed: {first}; check that DST was written by `etl run` "
            "(layout: docs/outputs.md)"
        ) from exc


def _empty_parquet(folder: Path, group: str, kind: str = SFT, *, images: bool = False) -> str:
    path = folder / f"empty-{group}.parquet"
    # An image run that wrote nothing still gets its image queries: their columns must be there.
    data = data_schema(weights=False, images=True) if images else KIND_SCHEMAS[kind]
    schema = data if group == "data" else _EMPTY_SCHEMAS[group]
    pq.write_table(schema.empty_table(), path)
    return str(path)
