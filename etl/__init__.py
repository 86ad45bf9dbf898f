"""etl: columnar SFT data preparation (raw chats -> tokenized Parquet -> torch batches)."""

import os

__version__ = "0.1.0"

# DuckDB's Linux builds allocate through their own jemalloc, which keeps freed pages 1 s dirty and
# then 1 s more as MADV_FREE pages that still count as resident: between two chunks the parse
# thread held ~220 MiB it no longer used. With 250 ms and no MADV_FREE stage, T0 x10's peak RSS
# went 1,071 -> 857 MiB for +0.6% wall, +2% CPU (bench/scale.py's run, 5 interleaved pairs; 100 ms:
# 847 MiB, +2.7% wall; 0: each parse ~75% slower). jemalloc reads this once, when DuckDB's library
# loads, so it is set here, before any of etl imports DuckDB; a value the user set wins.
DUCKDB_ALLOCATOR = "dirty_decay_ms:250,muzzy_decay_ms:0"
os.environ.setdefault("DUCKDB_JE_MALLOC_CONF", DUCKDB_ALLOCATOR)
