"""Training loader: Parquet-backed Dataset, resumable samplers, vectorized collate, packing.

Names are imported lazily (PEP 562) so torch-free users (`etl stats`, `etl export`) do not pay for
torch. The names here are those a training loop uses; the rest stay in their modules
(`etl.loader.collate.COLLATE_FNS`, `etl.loader.balance.BALANCERS`, ...). Losses, DPO/KTO and the
transformers/TRL calls that score the batches are `etl.train`; the episode export and its
`EpisodeDataLoader` live in `etl.export`.

    loader = ParquetLoader("parquet/", batch_size=32, seed=0)
    for batch in loader:  # x, y, loss_mask, attention_mask
        loss = model(batch["x"], batch["y"])

    packed = ParquetLoader("parquet/", batch_size=8, packing="bfd")  # + segment_ids, position_ids, ...

Preference data (manifest kind ``preference``): padded batches as TRL's DataCollatorForPreference
(`collate_pairs`), or ``packing="bfd"``: each pair once as [prompt, chosen, rejected]
(`pack_pairs`, `collate_pairs_packed`, masked by `pair_sdpa_mask` / `pair_block_mask`);
unpaired (KTO) rows: `collate_unpaired` (`etl.loader.pairs`).
"""

from __future__ import annotations

from etl.lazy import lazy_exports

_EXPORTS = {
    "ParquetLoader": "dataloader",
    "ParquetDataset": "dataset",
    "PadOptions": "groups",
    "PackOptions": "groups",
    "SamplerOptions": "groups",
    "CacheOptions": "groups",
    "DomainWeights": "groups",
    "TokenBalance": "balance",
    "EpochSampler": "samplers",
    "RandomSampler": "samplers",
    "PackSampler": "pack_sampler",
    "collate": "collate",
    "collate_packed": "collate_packed",
    "TorchCollate": "device",
    "Ragged": "etl.ragged",  # lives at the top: output/ uses it too
    "document_block_mask": "attention",
    "document_sdpa_mask": "attention",
    "rows_from_examples": "pairs.rows",
    "collate_pairs": "pairs.collate",
    "collate_unpaired": "pairs.collate",
    "pack_pairs": "pairs.pack",
    "collate_pairs_packed": "pairs.pack",
    "pair_block_mask": "pairs.attention",
    "pair_sdpa_mask": "pairs.attention",
}

__all__ = list(_EXPORTS)

# `collate` names both a submodule and its main function: importing the submodule (which any
# user of the loader does) would set the package attribute to the module and shadow the lazy
# lookup below, so the function is bound here, eagerly. collate.py needs numpy only, not torch.
from etl.loader.collate import collate as collate

__getattr__ = lazy_exports(__name__, _EXPORTS)
