"""Training helpers over the loader's batches: losses, DPO and KTO, and the transformers/TRL calls.

`etl.loader` yields the batches; this package scores them. Names are imported lazily (PEP 562),
as `etl.loader`'s are, so ``import etl.train`` alone imports no torch.

    logits = model(**hf_inputs(batch, model)).logits  # batch: a packed ParquetLoader batch
    loss = token_mean_loss(token_losses(logits, batch), batch)

- `loss`: per-token losses and the normalisation rules (token mean, example mean, sequence sum);
- `dpo`: per-pair completion log-probs (padded or prefix-shared packed pairs) and DPO's loss;
- `kto`: unpaired rows' log-probs and TRL's KTO loss;
- `hf`: ``model(**kw)`` keywords of a transformers causal LM for packed SFT and preference batches;
- `trl`: TRL's ``DPOTrainer`` trained on etl's tokenized pairs.
"""

from __future__ import annotations

from etl.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["token_losses", "trained_positions", "count_trained", "count_examples",
                     "token_mean_loss", "example_losses", "example_mean_loss", "sequence_sum_loss"], "loss"),
    "completion_logps": "dpo",
    "dpo_loss": "dpo",
    "unpaired_logps": "kto",
    "kto_loss": "kto",
    "hf_inputs": "hf",
    "pair_hf_inputs": "hf",
    "prepared_dpo_trainer": "trl",
}

__all__ = list(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
