"""The second pass of a mixture: read back each source's staged parts, draw, and write the mixed ones.

Pass one (`etl.mixture.run`) writes every source's examples to the staging folder as a plain
run would. Here each source's sizes (id, tokens, trained tokens: ~40 B per example, read column by
column) give its units; `etl.mixture.shares` sets how many copies of each record to keep, from
an MD5 draw of (seed, id), stable across machines and versions like the split draw. Each staged
part is then rewritten once with its rows taken `copies` times: copy k > 1 of a record gets id
`<id>#k`, in `data` and in `turns`, and stays in its record's split (no train/val leak).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from etl import columns as c
from etl.config.run_config import Mixture, RunSource
from etl.mixture.shares import copies, source_targets
from etl.mixture.summary import Staged, entry, shares_realised
from etl.output.part_writer import PartWriter, StagedParts
from etl.pipeline.accounting import Counts

SIZE_COLUMNS = [c.ID, c.NUM_TOKENS, c.NUM_TRAINED, c.TRUNCATED]
DRAW_SQL = "select md5_number_lower($seed || '/mix/' || id) as draw from sizes"
COPY_MARK = "#"  # copy k > 1 of record `id` is `id#k`


def mix_sources(mix: Mixture, inputs: tuple[RunSource, ...], staged: StagedParts, before: list[Counts],
                con: duckdb.DuckDBPyConnection, parts: PartWriter) -> tuple[dict[str, Any], Counts]:
    """Pass two: size each of the sources' (`inputs`) share, draw its records, write the mixed
    parts; the manifest's `mixture` section and the run's counts."""
    sources = [_read_staged(staged, s.name) for s in inputs]
    units = [s.units(mix.mix_by) for s in sources]
    weighted = inputs[0].weight is not None
    weights = np.array([s.weight or 0.0 for s in inputs]) if weighted else None
    default_epochs = np.inf if weighted else 1.0
    epochs = np.array([default_epochs if s.epochs is None else s.epochs for s in inputs])
    targets, shares = source_targets(np.array([u.sum() for u in units]), weights=weights, epochs=epochs,
                                     total=mix.mix_total)
    taken = []
    with parts.background():
        for source, rows, target in zip(sources, units, targets, strict=True):
            cp = copies(rows, draws(con, source.sizes, mix.seed), float(target))
            _write_mixed(source, cp, parts)
            taken.append(cp)
    entries = [entry(s, src, cp, n, mix.mix_by) for s, src, cp, n in zip(inputs, sources, taken, before,
                                                                            strict=True)]
    shares_realised(entries, shares, weighted=weighted)
    total = Counts(repeated=0)
    for line in entries:
        total.add(line.pop("_counts"))
    summary = {"mix_by": mix.mix_by, "mix_total": mix.mix_total if weighted else None, "seed": mix.seed,
               "sources": entries}
    return summary, total


def _read_staged(staged: StagedParts, source: str) -> Staged:
    """The staged data parts of `source` (every split) and their rows' sizes."""
    parts, tables = [], []
    for folder in staged.folders(source, c.DATA_DIR):
        for path in staged.staged(source, folder):
            table = pq.read_table(path, columns=SIZE_COLUMNS)
            parts.append((path, folder, table.num_rows))
            tables.append(table)
    schema = pa.schema([(c.ID, pa.string()), (c.NUM_TOKENS, pa.int32()), (c.NUM_TRAINED, pa.int32()),
                        (c.TRUNCATED, pa.bool_())])
    sizes = pa.concat_tables(tables) if tables else schema.empty_table()
    return Staged(parts, sizes)


def draws(con: duckdb.DuckDBPyConnection, sizes: pa.Table, seed: int) -> np.ndarray:
    """A uniform uint64 per record from MD5(seed/mix/id): the order records are drawn in."""
    cur = con.cursor()
    cur.register("sizes", sizes.select([c.ID]))
    try:
        return cur.sql(DRAW_SQL, params={"seed": str(seed)}).to_arrow_table().column("draw").to_numpy()
    finally:
        cur.unregister("sizes")


def _copy_rows(cp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row index, copy number from 1) of every output row: row i repeated cp[i] times, in order."""
    rows = np.repeat(np.arange(len(cp)), cp)
    starts = np.repeat(np.cumsum(cp) - cp, cp)
    return rows, np.arange(len(rows)) - starts + 1


def _copy_ids(ids: pa.Array, number: np.ndarray) -> pa.Array:
    """`id` for first copies, `id#k` for copy k > 1."""
    if not (number > 1).any():
        return ids
    marked = pc.binary_join_element_wise(ids, pa.array(number.astype(str)), COPY_MARK)
    return pc.if_else(pa.array(number > 1), marked, ids)


def _write_mixed(staged: Staged, cp: np.ndarray, parts: PartWriter) -> None:
    """Every staged part of one source with its rows taken `cp` times, as the next real parts of
    its folders (`data/<split>`, and `turns/<split>` beside it). A part repeated k times is written
    as k parts of its size, so memory stays that of one staged part."""
    offset = 0
    for path, folder, n in staged.parts:
        part_cp, offset = cp[offset:offset + n], offset + n
        if not part_cp.any():
            continue
        data = pq.read_table(path)
        # Preference and unpaired outputs have no turns parts.
        turns = pl.read_parquet(_turns_of(path, folder)) if _turns_of(path, folder).exists() else None
        rows, number = _copy_rows(part_cp)
        for start in range(0, len(rows), max(n, 1)):
            piece, piece_number = rows[start:start + n], number[start:start + n]
            taken = data.take(pa.array(piece))
            new_ids = _copy_ids(taken.column(c.ID).combine_chunks(), piece_number)
            parts.write(folder, taken.set_column(taken.schema.get_field_index(c.ID), c.ID, new_ids))
            if turns is not None:
                parts.write(c.TURNS_DIR + folder[len(c.DATA_DIR):], _mixed_turns(turns, taken.column(c.ID), new_ids))


def _turns_of(data_part: Path, folder: str) -> Path:
    """The staged turns part written beside a staged data part (same chunk, same split, same number)."""
    source_root = data_part.parents[len(Path(folder).parts)]
    return source_root / c.TURNS_DIR / Path(folder).relative_to(c.DATA_DIR) / data_part.name


def _mixed_turns(turns: pl.DataFrame, old_ids: pa.ChunkedArray, new_ids: pa.Array) -> pa.Table:
    """The turns of the taken rows, in their order, each under its copy's id."""
    wanted = pl.DataFrame({c.ID: pl.Series(old_ids.combine_chunks()), "_new": pl.Series(new_ids),
                           "_order": np.arange(len(new_ids))})
    joined = turns.join(wanted, on=c.ID, how="inner").sort("_order", c.TURN_INDEX, maintain_order=True)
    return joined.with_columns(pl.col("_new").alias(c.ID)).select(turns.columns).to_arrow()
