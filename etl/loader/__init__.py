"""Training loader: Parquet-backed Dataset, resumable samplers, vectorized collate, packing.

Names are imported lazily (PEP 562) so torch-free users (`etl stats`, `etl export`) do not pay for
torch. The episode export and its `EpisodeDataLoader` live in `etl.export`.

    loader = ParquetLoader("parquet/", batch_size=32, seed=0)
    for batch in loader:  # x, y, loss_mask, attention_mask
        loss = model(batch["x"], batch["y"])

    packed = ParquetLoader("parquet/", batch_size=8, packing="bfd")  # + segment_ids, position_ids, ...

Preference data (manifest kind ``preference``): padded batches as TRL's DataCollatorForPreference,
or ``packing="bfd"``: each pair once as [prompt, chosen, rejected] (`pack_pairs`,
`pair_hf_inputs`, `completion_logps`, `dpo_loss`); unpaired (KTO) rows:
`unpaired_logps`, `kto_loss`.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ParquetLoader": "dataloader",
    "PadOptions": "groups",
    "PackOptions": "groups",
    "SamplerOptions": "groups",
    "CacheOptions": "groups",
    "DomainWeights": "groups",
    "ParquetDataset": "dataset",
    "EpochSampler": "samplers",
    "RandomSampler": "samplers",
    "SAMPLERS": "samplers",
    "epoch_order": "orders",
    "COLLATE_FNS": "collate",
    "collate": "collate",
    "collate_fixed": "collate",
    "collate_longest": "collate",
    "resolve_pad_id": "collate",
    "collate_packed": "collate_packed",
    "PACKED_COLLATE_FNS": "collate_packed",
    "PairRows": "pairs_rows",
    "rows_from_examples": "pairs_rows",
    "collate_pairs": "pairs_collate",
    "collate_unpaired": "pairs_collate",
    "PackedPairs": "pairs_pack",
    "pack_pairs": "pairs_pack",
    "collate_pairs_packed": "pairs_pack",
    "pair_mask_mod": "pairs_attention",
    "pair_block_mask": "pairs_attention",
    "pair_sdpa_mask": "pairs_attention",
    "pair_hf_inputs": "pairs_attention",
    "completion_logps": "pairs_logps",
    "dpo_loss": "pairs_logps",
    "kto_loss": "pairs_kto",
    "unpaired_logps": "pairs_kto",
    "prepared_dpo_trainer": "trl_dpo",
    "document_block_mask": "attention",
    "document_sdpa_mask": "attention",
    "hf_inputs": "hf_kwargs",  # not hf_inputs.py: a submodule of that name would shadow it
    "PackSampler": "pack_sampler",
    "TokenBalance": "balance",
    "BALANCERS": "balance",
    "Ragged": "etl.ragged",  # lives at the top: output/ uses it too
    "TorchCollate": "device",
    **dict.fromkeys(["token_losses", "trained_positions", "count_trained", "count_examples",
                     "token_mean_loss", "example_losses", "example_mean_loss", "sequence_sum_loss"], "loss"),
}

__all__ = list(_EXPORTS)

# `collate` names both a submodule and its main function: importing the submodule (which any
# user of the loader does) would set the package attribute to the module and shadow the lazy
# lookup below, so the function is bound here, eagerly. collate.py needs numpy only, not torch.
from etl.loader.collate import collate as collate


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'etl.loader' has no attribute {name!r}")
    module = _EXPORTS[name]
    return getattr(importlib.import_module(module if "." in module else f"etl.loader.{module}"), name)
