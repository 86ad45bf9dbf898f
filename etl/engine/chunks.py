"""The Ray engine's unit of work: one chunk of one input file as one row of a Ray dataset.

A row holds the chunk's table as Arrow IPC bytes (raw lines, later the parsed records), so chunks
whose parsed schemas differ share one dataset schema, and a chunk is never split or merged by Ray's
block sizing: `(file, chunk)` names it everywhere (part names, dedup, the driver's order).
A file the reader cannot read (to its end) ends with an error row, as the local engine's
`UnreadableFile` item does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from etl.ingest.discover import Source, UnreadableFile
from etl.ingest.reader import read_chunks, run_first_bytes

FILE, CHUNK, TABLE, ERROR, REASON, RECORDS_READ = "file", "chunk", "table", "error", "reason", "records_read"
CHUNK_SCHEMA = pa.schema(
    [
        (FILE, pa.int32()),
        (CHUNK, pa.int32()),
        (TABLE, pa.large_binary()),  # null on an error row
        (ERROR, pa.string()),  # str(UnreadableFile) on an error row
        (REASON, pa.string()),
        (RECORDS_READ, pa.int64()),  # records of the file read before the error
    ]
)


def to_ipc(table: pa.Table) -> pa.Buffer:
    """A table as Arrow IPC stream bytes (one copy; read back zero-copy by `_from_ipc`)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _from_ipc(data: pa.Buffer | bytes) -> pa.Table:
    """The table `to_ipc` wrote."""
    return pa.ipc.open_stream(pa.py_buffer(data) if isinstance(data, bytes) else data).read_all()


@dataclass(frozen=True)
class ChunkRow:
    """One chunk (or a file's error) as the driver and the workers see it."""

    file: int
    chunk: int
    table: pa.Table | None = None
    error: UnreadableFile | None = None
    records_read: int = 0

    def to_table(self) -> pa.Table:
        """A one-row table of CHUNK_SCHEMA."""
        err = self.error
        return pa.table(
            {
                FILE: [self.file],
                CHUNK: [self.chunk],
                TABLE: pa.array([None if self.table is None else to_ipc(self.table).to_pybytes()],
                                pa.large_binary()),
                ERROR: [None if err is None else str(err)],
                REASON: [None if err is None else err.reason],
                RECORDS_READ: [self.records_read],
            },
            schema=CHUNK_SCHEMA,
        )

    @classmethod
    def rows_of(cls, batch: pa.Table) -> Iterator[ChunkRow]:
        """The chunk rows of a batch of CHUNK_SCHEMA rows."""
        for row in batch.to_pylist():
            error = None
            if row[ERROR] is not None:
                error = UnreadableFile(row[ERROR])
                error.reason = row[REASON]  # UnreadableDir's reason, kept as a plain attribute
            table = None if row[TABLE] is None else _from_ipc(row[TABLE])
            yield cls(row[FILE], row[CHUNK], table, error, row[RECORDS_READ])


def raw_chunks(
    sources: list[tuple[int, Source]], *, chunk_bytes: int, max_items: int | None
) -> Iterator[pa.Table]:
    """Chunk rows of raw `(source_line, line)` tables of `sources` (index, source), in order.

    `max_items` caps the records read over all of `sources` in their order, as the local engine
    does (`etl.pipeline.run.parsed_chunks`); the caller gives one call every file then.
    """
    budget = max_items
    for index, source in sources:
        if budget == 0:
            return
        number = records = 0
        try:
            for raw in read_chunks(source, chunk_bytes=chunk_bytes, first_bytes=run_first_bytes(index, chunk_bytes)):
                if budget is not None:
                    raw = raw.slice(0, budget)
                    budget -= raw.num_rows
                    if raw.num_rows == 0:
                        break
                records += raw.num_rows
                yield ChunkRow(index, number, raw).to_table()
                number += 1
        except UnreadableFile as exc:
            yield ChunkRow(index, number, error=exc, records_read=records).to_table()
