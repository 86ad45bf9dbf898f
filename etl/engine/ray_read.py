"""Ray Data reads of SRC: one read task per input file, each yielding the file's chunk rows.

Files are read in parallel on the cluster's workers with etl's own reader (so line numbers,
rejects, compressed and damaged files behave as in the local engine); a gzip/zstd file is one
stream, so one file is one task. With `preprocessing.max_items` the budget runs over the files in
order, so then one task reads them all, as the local engine does.
"""

from __future__ import annotations

from typing import Any

from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from etl.engine.chunks import CHUNK_SCHEMA, raw_chunks
from etl.ingest.discover import Source


class ChunkSource(Datasource):
    """SRC's input files as chunk rows (`etl.engine.chunks.CHUNK_SCHEMA`)."""

    def __init__(self, sources: list[Source], *, chunk_bytes: int, max_items: int | None) -> None:
        self.sources = list(enumerate(sources))
        self.chunk_bytes, self.max_items = chunk_bytes, max_items

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(s.size() for _, s in self.sources)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        groups = [self.sources] if self.max_items is not None else [[s] for s in self.sources]
        return [self._task(group) for group in groups]

    def _task(self, group: list[tuple[int, Source]]) -> ReadTask:
        chunk_bytes, max_items = self.chunk_bytes, self.max_items

        def read() -> Any:
            yield from raw_chunks(group, chunk_bytes=chunk_bytes, max_items=max_items)

        size = sum(s.size() for _, s in group)
        meta = BlockMetadata(num_rows=None, size_bytes=size, exec_stats=None,
                             input_files=[str(s.path) for _, s in group])
        return ReadTask(read, meta, schema=CHUNK_SCHEMA)
