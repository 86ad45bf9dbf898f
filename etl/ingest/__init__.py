"""Reading input: files to byte-bounded `(source_line, line)` chunks, prefetch, dedup and split."""
