"""`ParquetLoader`'s keywords from before its option groups, kept for one release.

Each old keyword is folded into its group (`LEGACY_KEYWORDS`), and one DeprecationWarning per
call names the call to write instead: ``ParquetLoader(pad_multiple=...)`` becomes
``collate=PadOptions('longest', pad_multiple=...)``. An old keyword that had no effect in the
chosen mode (``target`` without packing, ``pad_multiple`` with it) is dropped, as it was ignored.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from etl.errors import EtlError
from etl.loader.balance import TokenBalance, token_balance
from etl.loader.groups import CacheOptions, DomainWeights, PackOptions, PadOptions, SamplerOptions

_ROWS = "rows"  # the mode's group: packing= when packing, else collate=
_PACKER = "packer"  # pack_options: a dict of packer keywords

# Old keyword -> (group keyword, field of that group).
LEGACY_KEYWORDS: dict[str, tuple[str, str]] = {
    "pad_id": (_ROWS, "pad_id"),
    "use_loss_mask": (_ROWS, "use_loss_mask"),
    "mask_dtype": (_ROWS, "mask_dtype"),
    "truncation": (_ROWS, "truncation"),
    "min_tokens": (_ROWS, "min_tokens"),
    "weights": (_ROWS, "loss_weight"),
    "pad_multiple": ("collate", "pad_multiple"),
    "pack_options": ("packing", _PACKER),
    "target": ("packing", "target"),
    "mask_boundary_loss": ("packing", "mask_boundary_loss"),
    "train_on_eos": ("packing", "train_on_eos"),
    "eos_id": ("packing", "eos_id"),
    "shuffle_window": ("sampler", "shuffle_window"),
    "num_batches": ("sampler", "num_batches"),
    "cache_row_groups": ("cache", "row_groups"),
    "cache_mb": ("cache", "mb"),
    "balance_tokens": ("balance", "strategy"),
    "balance_window": ("balance", "window"),
    "domain_weights": ("domains", "weights"),
}
_GROUPS = {"collate": PadOptions, "packing": PackOptions, "sampler": SamplerOptions, "cache": CacheOptions}


def _sort(legacy: dict[str, Any], packing: bool) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The fields of each group the old keywords set, and the keywords dropped (no effect)."""
    fields: dict[str, dict[str, Any]] = {}
    dropped = []
    for old, value in legacy.items():
        group, field = LEGACY_KEYWORDS[old]
        group = ("packing" if packing else "collate") if group == _ROWS else group
        if (group == "packing") != packing and group in ("packing", "collate"):
            dropped.append(old)
        elif field == _PACKER:
            known = {"buffer_docs", "max_docs_per_bin"}
            unknown = sorted(set(value or {}) - known)
            if unknown:
                raise EtlError(f"pack_options {unknown} are not packer options; PackOptions takes {sorted(known)}")
            fields.setdefault(group, {}).update({k: v for k, v in (value or {}).items() if v is not None})
        else:
            fields.setdefault(group, {})[field] = value
    return fields, dropped


def _build(group: str, given: Any, fields: dict[str, Any], dropped: list[str]) -> Any:
    """The group ``given`` (a dataclass, a shorthand name or None) with the old ``fields`` set."""
    if group == "domains":
        return None if fields["weights"] is None else DomainWeights(fields["weights"])
    if group == "balance":
        if isinstance(given, TokenBalance):
            return dataclasses.replace(given, **{k: v for k, v in fields.items() if v is not None})
        return token_balance(fields.get("strategy", given or False), fields.get("window"))
    cls = _GROUPS[group]
    base = given if isinstance(given, cls) else cls(given) if isinstance(given, str) else cls()
    if group == "collate" and base.strategy != "longest" and fields.pop("pad_multiple", None) is not None:
        dropped.append("pad_multiple")  # it rounded T of collate 'longest' only
    if group == "sampler" and base.strategy != "random" and fields.pop("num_batches", None) is not None:
        dropped.append("num_batches")  # the length of a 'random' epoch only
    return dataclasses.replace(base, **fields)


def upgrade(legacy: dict[str, Any], groups: dict[str, Any]) -> dict[str, Any]:
    """``groups`` (the loader's group keywords) with the old keywords in ``legacy`` folded in.

    Warns once (DeprecationWarning) naming the group keywords to pass instead.

    Raises:
        TypeError: a keyword the loader never took (as Python says for any function).
    """
    if not legacy:
        return groups
    unknown = sorted(set(legacy) - set(LEGACY_KEYWORDS))
    if unknown:
        raise TypeError(f"ParquetLoader() got an unexpected keyword argument {unknown[0]!r}")
    fields, dropped = _sort(legacy, packing=groups["packing"] is not None)
    new = {group: _build(group, groups[group], values, dropped) for group, values in fields.items()}
    old = ", ".join(f"{k}=..." for k in legacy)
    defaults = {k: cls() for k, cls in _GROUPS.items()}
    instead = ", ".join(f"{k}={v!r}" for k, v in new.items() if v is not None and v != defaults.get(k))
    note = f" ({', '.join(dropped)}: no effect in this mode, dropped)" if dropped else ""
    warnings.warn(f"ParquetLoader({old}) is deprecated and will be removed in the next release: "
                  f"pass {instead or 'nothing'}{note}", DeprecationWarning, stacklevel=3)
    return {**groups, **new}
