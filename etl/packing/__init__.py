"""Packing: variable-length examples into rows of at most S tokens (chomp-style bin and sequential
packing, stream packing with boundary injection).

Packers are pure numpy functions from example lengths to a `Packing` (pieces of examples placed
in packs), behind `PACKERS`; `index.py` writes and reads the pack index of `etl pack`.
"""
