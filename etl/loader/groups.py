"""`ParquetLoader`'s option groups: small frozen dataclasses, each checked where it is built.

A group holds the options of one mode or one concern, so an option that does not apply cannot
be passed: `PadOptions` shapes padded batches (``collate=``), `PackOptions` packed ones
(``packing=``; passing both is an error), `SamplerOptions` picks the row order, `CacheOptions`
sizes the row-group cache, `DomainWeights` reweights domains (``domains=``) and
`etl.loader.balance.TokenBalance` deals tokens evenly across ranks (``balance=``).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any, Literal

from etl.columns import CUT_SIDES
from etl.errors import EtlError
from etl.loader.balance import TokenBalance, token_balance
from etl.loader.collate import COLLATE_FNS, CutSide
from etl.loader.domain_mix import check_domain_weights
from etl.loader.options import check_choice
from etl.loader.samplers import SAMPLERS
from etl.packing.registry import PACKERS


def _check_int(owner: str, name: str, value: Any, low: int, *, optional: bool = False) -> None:
    """Raise unless ``value`` is an integer >= ``low`` (or None when ``optional``)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise EtlError(f"{owner}({name}=...) must be an integer >= {low}, got {value!r}")


class _Group:
    """A group's repr names only the fields that differ from their defaults: the form to type."""

    def __repr__(self) -> str:
        fields = [f for f in dataclasses.fields(self) if f.repr]  # type: ignore[arg-type]
        first = [f for f in fields if f.name == "strategy"]
        shown = [f"{getattr(self, f.name)!r}" for f in first]
        shown += [f"{f.name}={getattr(self, f.name)!r}" for f in fields
                  if f.name != "strategy" and getattr(self, f.name) != f.default]
        return f"{type(self).__name__}({', '.join(shown)})"


@dataclass(frozen=True, repr=False, kw_only=True)
class _RowOptions(_Group):
    """How an example becomes a row: shared by padded and packed batches.

    Attributes:
        pad_id: id after a row's last token; default the manifest's ``pad_id``, else ``eot_id``.
        use_loss_mask: False trains every real token.
        mask_dtype: ``bool`` or ``float32`` loss mask.
        truncation: ``right`` keeps the first S tokens of a longer example, ``left`` the last.
        min_tokens: leave out examples shorter than this (not with `etl pack`'s index: it
            holds every example).
        loss_weight: deliver ``loss_weight`` when the data has it; None (default) does so
            whenever the column exists, False ignores it.
    """

    pad_id: int | None = None
    use_loss_mask: bool = True
    mask_dtype: Literal["bool", "float32"] = "bool"
    truncation: CutSide = "right"
    min_tokens: int = 2
    loss_weight: bool | None = None

    def __post_init__(self) -> None:
        owner = type(self).__name__
        check_choice("mask_dtype", self.mask_dtype, ["bool", "float32"])
        check_choice("truncation", self.truncation, list(CUT_SIDES))
        _check_int(owner, "pad_id", self.pad_id, 0, optional=True)
        _check_int(owner, "min_tokens", self.min_tokens, 0)


@dataclass(frozen=True, repr=False)
class PadOptions(_RowOptions):
    """Padded batches (no packing): one example a row, padded to T.

    Trade-off: ``fixed`` gives every batch T = S - 1 (steady shapes for compiled models, but a
    short example pays for S); ``longest`` pads to exactly the batch's longest example, as
    TRL's ``DataCollatorForLanguageModeling`` does (less padding, shapes that vary by batch).
    Pass it as ``collate=``; the shared row options are listed on `_RowOptions`.

    Attributes:
        strategy: ``fixed`` or ``longest`` (`etl.loader.collate.COLLATE_FNS`).
        pad_multiple: ``longest`` only: T is rounded up to a multiple of it (TRL's
            ``pad_to_multiple_of``: 8 for tensor cores, 64 or more to bucket shapes for a
            compiled model); default None: no rounding.
    """

    strategy: str = "fixed"
    _: KW_ONLY
    pad_multiple: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("collate", self.strategy, sorted(COLLATE_FNS))
        if self.pad_multiple is not None and self.strategy != "longest":
            raise EtlError(f"pad_multiple rounds T of collate 'longest'; collate {self.strategy!r} always "
                           f"pads to T = S - 1: pass PadOptions('longest', pad_multiple={self.pad_multiple})")
        _check_int("PadOptions", "pad_multiple", self.pad_multiple, 1, optional=True)

    @property
    def multiple(self) -> int:
        """The rounding of T the collate uses (1, none, when not given)."""
        return 1 if self.pad_multiple is None else self.pad_multiple


@dataclass(frozen=True, repr=False)
class PackOptions(_RowOptions):
    """Packed batches: B rows of whole examples (or pieces) back to back, at most S tokens each.

    Pass it as ``packing=`` (``packing="bfd"`` is ``PackOptions("bfd")``). Trade-off: ~no
    padding, but the model must read ``segment_ids`` / ``position_ids`` (docs/packing.md).

    Attributes:
        strategy: a key of `etl.packing.registry.PACKERS`: ``bfd``, ``ffd``, ``sequential``, ``stream``.
        buffer_docs, max_docs_per_bin: ``bfd`` / ``ffd`` knobs (windows of examples packed
            alone; most examples a pack), as `etl pack --buffer-docs / --max-docs-per-bin`.
        target: ``y`` (``x`` / ``y``, shifted here, T = S - 1) or ``labels`` (``input_ids`` /
            ``labels``, the model shifts: T = S, so every token of a full pack is kept).
        mask_boundary_loss: no label predicts the next document's first token.
        train_on_eos: False sets every label equal to ``eos_id`` to -100.
        eos_id: default the manifest's last ``eos_ids``, else its ``eot_id``.
    """

    strategy: str = "bfd"
    _: KW_ONLY
    buffer_docs: int | None = None
    max_docs_per_bin: int | None = None
    target: Literal["y", "labels"] = "y"
    mask_boundary_loss: bool = True
    train_on_eos: bool = True
    eos_id: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("packing", self.strategy, sorted(PACKERS))
        check_choice("target", self.target, ["labels", "y"])
        params = inspect.signature(PACKERS[self.strategy]).parameters
        for name in ("buffer_docs", "max_docs_per_bin"):
            value = getattr(self, name)
            if value is not None and name not in params:
                raise EtlError(f"packing {self.strategy!r} takes no {name} (bfd and ffd do): "
                               f"drop it or pass PackOptions('bfd', {name}={value!r})")
            _check_int("PackOptions", name, value, 1, optional=True)
        _check_int("PackOptions", "eos_id", self.eos_id, 0, optional=True)

    @property
    def packer_options(self) -> dict[str, int]:
        """The packer's keywords that are set (what `etl pack`'s index records as options)."""
        return {k: v for k in ("buffer_docs", "max_docs_per_bin") if (v := getattr(self, k)) is not None}


@dataclass(frozen=True, repr=False)
class SamplerOptions(_Group):
    """Which rows an epoch holds, and in what order.

    Attributes:
        strategy: ``epoch`` (every row once an epoch; with packing, every pack) or ``random``
            (draws with replacement; not with packing).
        shuffle_window: row groups mixed per shuffling window (block shuffle: reads stay within
            the cache, `etl.loader.orders.epoch_order`); None or 0 shuffles the whole split.
        num_batches: ``random`` only: batches an epoch (default rows // (B x world_size)).
    """

    strategy: str = "epoch"
    _: KW_ONLY
    shuffle_window: int | None = 8
    num_batches: int | None = None

    def __post_init__(self) -> None:
        check_choice("sampler", self.strategy, sorted(SAMPLERS))
        _check_int("SamplerOptions", "shuffle_window", self.shuffle_window, 0, optional=True)
        _check_int("SamplerOptions", "num_batches", self.num_batches, 1, optional=True)
        if self.num_batches is not None and self.strategy != "random":
            raise EtlError(f"num_batches is the length of a 'random' epoch; an {self.strategy!r} epoch "
                           f"holds every row: pass SamplerOptions('random', num_batches={self.num_batches})")

    @property
    def window(self) -> int:
        """Row groups per shuffling window; 0 shuffles the whole split."""
        return self.shuffle_window or 0


@dataclass(frozen=True, repr=False)
class CacheOptions(_Group):
    """Decoded row groups kept per process (per DataLoader worker).

    Attributes:
        row_groups: always kept (raised to the sampler's ``shuffle_window``).
        mb: more are kept while they fit in this budget; a split that fits is held whole
            (packs gather examples from all over it), ~5 bytes a token.
    """

    row_groups: int = 8
    mb: float = 256

    def __post_init__(self) -> None:
        _check_int("CacheOptions", "row_groups", self.row_groups, 1)
        if isinstance(self.mb, bool) or not isinstance(self.mb, (int, float)) or not self.mb >= 0 \
                or not math.isfinite(self.mb):
            raise EtlError(f"CacheOptions(mb=...) must be a number of MiB >= 0, got {self.mb!r}")


@dataclass(frozen=True, repr=False)
class DomainWeights(_Group):
    """``{domain: weight}``: each epoch keeps len(dataset) examples, domain d's share w_d / sum(w).

    Rows of a domain are repeated or a seeded subset, new every epoch; domains not named are
    left out (docs/training.md "Domain weights", `etl.loader.domain_mix`). ``domains={...}`` is short for it.

    Attributes:
        weights: finite numbers >= 0 with a positive sum (stored sorted by domain).
    """

    weights: Mapping[str, float]

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", check_domain_weights(self.weights))


@dataclass(frozen=True)
class LoaderGroups:
    """Every group of one `ParquetLoader`, shorthands resolved (`resolve_groups`).

    Attributes:
        rows: the mode's group: ``packing`` when packing, else the `PadOptions`.
        packing: the `PackOptions`, or None for padded batches.
    """

    rows: PadOptions | PackOptions
    packing: PackOptions | None
    sampler: SamplerOptions
    balance: TokenBalance | None
    domains: DomainWeights | None
    cache: CacheOptions


def _group(name: str, value: Any, cls: type, shorthand: str) -> Any:
    """``value`` as ``cls``: itself, built from a name, or an error saying what the keyword takes."""
    if isinstance(value, str) and shorthand:
        return cls(value)
    if value is None or isinstance(value, cls):
        return value
    others = {PadOptions: "collate", PackOptions: "packing", SamplerOptions: "sampler",
              CacheOptions: "cache", DomainWeights: "domains", TokenBalance: "balance"}
    where = f"; {type(value).__name__} goes to {others[type(value)]}=" if type(value) in others else ""
    takes = f"{shorthand} or " if shorthand else ""
    raise EtlError(f"{name}= takes {takes}{cls.__name__}(...), got {value!r}{where}")


def resolve_groups(
    *, packing: Any, collate: Any, sampler: Any, balance: Any, domains: Any, cache: Any
) -> LoaderGroups:
    """The loader's group keywords as dataclasses, shorthands expanded (``packing="bfd"``,
    ``collate="longest"``, ``sampler="random"``, ``balance=True``, ``domains={...}``), with the
    checks that span groups: padding options and packing exclude each other, packing samples
    by epoch.

    Raises:
        EtlError: a keyword given the wrong kind of value, or groups that do not go together.
    """
    pack = _group("packing", packing, PackOptions, "a strategy name (bfd, ffd, sequential, stream)")
    pad = _group("collate", collate, PadOptions, "'fixed', 'longest'")
    if pack is not None and pad is not None:
        raise EtlError(f"collate={pad!r} shapes padded batches, but packing={pack!r} packs them; pad_id, "
                       "use_loss_mask, mask_dtype, truncation, min_tokens and loss_weight go in "
                       "PackOptions(...) too: drop collate= (or drop packing= for padded batches)")
    order = _group("sampler", sampler, SamplerOptions, "'epoch', 'random'") or SamplerOptions()
    if pack is not None and order.strategy != "epoch":
        raise EtlError("packing delivers every pack once an epoch: use sampler 'epoch' with packing= "
                       "(or drop packing= to draw rows with sampler 'random')")
    if isinstance(balance, (bool, str)):
        balance = token_balance(balance)
    if domains is not None and not isinstance(domains, DomainWeights):
        domains = DomainWeights(domains)  # a dict: its checks say what else is wrong
    return LoaderGroups(
        rows=pack or pad or PadOptions(), packing=pack, sampler=order,
        balance=_group("balance", balance, TokenBalance, "True, a dealer name"),
        domains=domains,
        cache=_group("cache", cache, CacheOptions, "") or CacheOptions(),
    )
