"""TRL's `DPOTrainer` on etl's tokenized pairs: skip its tokenizing step, checked against TRL's version.

TRL 1.16 tokenizes every dataset a ``DPOTrainer`` is given (``_prepare_dataset``, a private
method that expects text), and has no switch for data tokenized already. The only way to train
etl's ``prompt_ids`` / ``chosen_ids`` / ``rejected_ids`` as written is to override that method,
so `prepared_dpo_trainer` does it in one place, after checking the method still exists with the
signature it was written for: a TRL that renames or reshapes it fails here, at class creation,
with a message, not deep inside a training run.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

from etl.columns import CHOSEN_IDS, PROMPT_IDS, REJECTED_IDS
from etl.errors import EtlError, EtlWarning

TESTED_TRL = ("1.16",)  # the major.minor releases this adapter is tested with
PREPARE = "_prepare_dataset"
PREPARE_PARAMS = ("self", "dataset", "processing_class", "args", "dataset_name")
TOKENIZED = (PROMPT_IDS, CHOSEN_IDS, REJECTED_IDS)


def _trl_version() -> str:
    import trl

    return str(getattr(trl, "__version__", "unknown"))


def check_dpo_trainer(trainer_class: type) -> None:
    """Raise unless ``trainer_class`` has TRL 1.16's ``_prepare_dataset(self, dataset,
    processing_class, args, dataset_name)``; warn when TRL's version is not one tested.

    Raises:
        EtlError: the method is gone or takes other arguments (TRL changed it).
    """
    version = _trl_version()
    method = inspect.getattr_static(trainer_class, PREPARE, None)
    params = tuple(inspect.signature(method).parameters) if callable(method) else None
    if params != PREPARE_PARAMS:
        found = "no such method" if params is None else f"{PREPARE}({', '.join(params)})"
        raise EtlError(
            f"{trainer_class.__name__}.{PREPARE} changed (TRL {version} is installed): it is the private "
            f"step etl's adapter overrides to train tokenized pairs, written for "
            f"{PREPARE}({', '.join(PREPARE_PARAMS)}) of TRL {', '.join(TESTED_TRL)}; found {found}. "
            f"Install trl=={TESTED_TRL[-1]}.* (`pip install 'trl~={TESTED_TRL[-1]}.0'`), or train with "
            "etl's own DPO helpers (etl.loader.ParquetLoader, etl.train.completion_logps and dpo_loss: "
            "docs/preference.md)"
        )
    if ".".join(version.split(".")[:2]) not in TESTED_TRL:
        warnings.warn(f"etl's DPOTrainer adapter is tested with TRL {', '.join(TESTED_TRL)}, this is {version}; "
                      f"{PREPARE} still has the expected arguments, so it is used: check the first batch",
                      EtlWarning, stacklevel=3)


def _check_columns(dataset: Any, name: str) -> None:
    """The dataset must hold etl's token columns: TRL's collator reads them as they are."""
    columns = getattr(dataset, "column_names", None)
    if columns is None:  # an IterableDataset may not know its columns before the first row
        columns = list(next(iter(dataset)))
    missing = [c for c in TOKENIZED if c not in columns]
    if missing:
        raise EtlError(f"the {name} dataset has no {', '.join(missing)} (its columns: {sorted(columns)}): pass "
                       "load_dataset(DST) of an `etl run --input-type preference` output, or use TRL's own "
                       "DPOTrainer for text pairs")


def prepared_dpo_trainer(trainer_class: type | None = None) -> type:
    """A subclass of TRL's ``DPOTrainer`` (or of ``trainer_class``, a subclass of it) that trains
    the dataset's ``prompt_ids``, ``chosen_ids`` and ``rejected_ids`` as etl wrote them.

    Trade-off: it leans on a private TRL method, so it is checked (`check_dpo_trainer`) each
    time it is built; everything else (collator, loss, reference model) is TRL's own.

    Usage: ``prepared_dpo_trainer()(model=..., ref_model=..., args=DPOConfig(...),
    train_dataset=load_dataset(DST)["train"], processing_class=tokenizer)``.

    Raises:
        EtlError: TRL's ``_prepare_dataset`` changed; later, a dataset without etl's token columns.
    """
    if trainer_class is None:
        from trl import DPOTrainer

        trainer_class = DPOTrainer
    check_dpo_trainer(trainer_class)

    def _prepare_dataset(self: Any, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
        del self, processing_class, args  # etl tokenized the pairs with the run's template already
        _check_columns(dataset, dataset_name)
        return dataset

    return type(f"Prepared{trainer_class.__name__}", (trainer_class,), {PREPARE: _prepare_dataset,
                                                                       "__module__": __name__})
