"""The per-chunk build: Polars stages plan turns, numpy assembles examples; `run` drives it."""
