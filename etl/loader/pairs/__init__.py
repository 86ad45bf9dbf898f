"""Preference pairs and unpaired (KTO) rows: the manifest kinds ``preference`` and ``unpaired``.

`rows` reads their columns (`PairRows`), `collate` pads them as TRL's collators do, `pack`
packs each pair once as [prompt, chosen, rejected] (prefix-shared), `attention` masks those
packs, and `loader` gives `ParquetLoader` the sampler and collate of a pair kind. The training
side (log-probs, DPO and KTO losses, the transformers call) is `etl.train`.
"""
