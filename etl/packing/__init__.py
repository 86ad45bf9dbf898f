"""Packing (seeds 001, 003): variable-length examples into rows of at most S tokens.

Packers are pure numpy functions from example lengths to a `Packing` (pieces of examples placed
in packs), behind `PACKERS`; `index.py` writes and reads the pack index of `etl pack`.
"""
