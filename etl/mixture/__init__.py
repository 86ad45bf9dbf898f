"""A mixture: several sources in one run, each read with its own options, then mixed by weight.

`run.py` runs one through the run driver (pass one stages each source's parts); `resample.py` is
pass two (read back, draw, write the mixed parts); `shares.py` sizes each source's share and its
records' copies; `summary.py` writes the manifest's `mixture` section. The declarations
(`Mixture`, `MixSource`) are the config's (`etl.config.run_config`)."""
