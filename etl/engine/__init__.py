"""Execution engines besides the local one: `--engine ray` runs `etl run`'s per-chunk work on a
Ray cluster (`etl.engine.ray_run`). Nothing here is imported by the local engine."""
