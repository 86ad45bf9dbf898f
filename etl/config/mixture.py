"""A mixture: several sources in one run, each with its own input and options, mixed by weight.

`sources` in a config file is a list of tables (TOML `[[sources]]`). Each names a `path` and may
set the per-source options of `SOURCE_OPTIONS`; what it leaves out falls back to the file's top
level, key by key (a source's `input` without a `type` extends the top level's input; with another
type it stands alone). Run-wide settings (tokenizer, template, seq_len, split, output, dedup)
stay at the top level. The mixing itself (`weight`, `epochs`, `mix_by`, `mix_total`, `seed`) is
etl.pipeline.mix_plan's; the declarations here feed the schema, the README table and errors.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from etl.config.fields import Limit, setting

MixBy = Literal["tokens", "examples"]
MixTotal = Literal["sum", "first_exhausted", "all_exhausted"]
POSITIVE_NUMBER = Limit("must be a positive number, got {value}", gt=0)
# Keys a source may set besides its own (name, path, domain, weight, epochs): per-source options.
SOURCE_OPTIONS = ("input", "default_system", "mask", "mask_default", "mask_options", "truncation", "max_items")
# A source's max_items is preprocessing.max_items for its records alone.
SOURCE_PATHS = {"max_items": ("preprocessing", "max_items")}
MIX_KEYS = ("sources", "seed", "mix_by", "mix_total")
# seed 004's `mask` when a file has none: a source's mask rules extend it, role by role.
DEFAULT_MASK = {"assistant": "train"}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class MixOptions:
    """Top-level keys of a mixture config."""

    seed: int = setting(0, "seed", "seed of a mixture's draws (which records are kept or repeated)")
    mix_by: MixBy = setting("tokens", "mix_by", "unit of a mixture's shares: tokens or examples")
    mix_total: MixTotal = setting(
        "sum", "mix_total", "a weighted mixture's size: the sources' sum (Mosaic's default), the largest "
        "no source repeats in (HF interleave first_exhausted), or the smallest that uses every record "
        "(all_exhausted)")


@dataclass(frozen=True)
class SourceOptions:
    """The keys of one `sources` entry that are its own (options shared with the top level aside)."""

    path: str = setting("", "sources.path", "the source's file, folder or glob (relative to the working "
                        "folder, as SRC)")
    name: str | None = setting(None, "sources.name", "names its records (`source_file` = name/file); "
                               "default: the path's stem")
    domain: str | None = setting(None, "sources.domain", "the `domain` of its records; default: its name "
                                 "(a record's input.domain_key value wins)")
    weight: float | None = setting(None, "sources.weight", "its share of the output, relative to the other "
                                   "sources' weights (in mix_by units)", limit=POSITIVE_NUMBER)
    epochs: float | None = setting(None, "sources.epochs", "repeat factor, fractional allowed (default 1); "
                                   "with weight: the most a share may repeat the source", limit=POSITIVE_NUMBER)


@dataclass(frozen=True)
class MixSource:
    """One source of a mixture, resolved: its name, domain, mixing rule and whole run config."""

    name: str
    path: str
    domain: str
    weight: float | None
    epochs: float | None
    config: Any  # RunConfig (etl.config.run_config imports this module)


@dataclass(frozen=True)
class Mixture:
    sources: tuple[MixSource, ...]
    seed: int = 0
    mix_by: MixBy = "tokens"
    mix_total: MixTotal = "sum"

    def to_json(self) -> dict[str, Any]:
        """For the manifest: each source with its whole config."""
        return {"seed": self.seed, "mix_by": self.mix_by, "mix_total": self.mix_total,
                "sources": [{**{k: v for k, v in asdict(s).items() if k != "config"}, "config": s.config.to_json()}
                            for s in self.sources]}


def default_name(path: str) -> str:
    """A source's name from its path: the file's stem without its extensions, or the folder's."""
    p = Path(path.rstrip("/"))
    stem = p.name.split(".")[0] if "." in p.name and not p.name.startswith(".") else p.name
    return stem if _NAME.fullmatch(stem or "") else "source"


def check_name(name: str, where: str) -> str:
    from etl.errors import EtlError

    if not _NAME.fullmatch(name):
        raise EtlError(f"config: {where}.name {name!r} must be letters, digits, '_', '.' or '-' "
                       "(it prefixes source_file and ids)")
    return name


def merged_doc(top: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """The config document of one source: the top level's, with the entry's options over it key by key."""
    doc = {k: v for k, v in top.items() if k not in MIX_KEYS}
    for key in SOURCE_OPTIONS:
        if key not in entry:
            continue
        section, name = SOURCE_PATHS.get(key, (None, key))
        if section is not None:
            doc[section] = {**doc.get(section, {}), name: entry[key]}
        elif key == "input":
            doc[key] = _merged_input(doc.get("input", {}), entry[key])
        elif key == "mask" and isinstance(entry[key], dict):
            doc[key] = {**doc.get("mask", DEFAULT_MASK), **entry[key]}
        elif isinstance(entry[key], dict) and isinstance(doc.get(key), dict):
            doc[key] = {**doc[key], **entry[key]}
        else:
            doc[key] = entry[key]
    return doc


def _merged_input(top: dict[str, Any], own: Any) -> Any:
    """A source's input over the top level's: extended when of the same type, else on its own."""
    if not isinstance(own, dict):
        return own  # the schema check says that input must be an object
    top_type = top.get("type", "chat")
    return {**top, **own} if own.get("type", top_type) == top_type else own


def mixture_from_doc(doc: dict[str, Any], source_config: Callable[[dict[str, Any]], Any]) -> Mixture:
    """The mixture a checked config document declares; `source_config` makes a source's RunConfig
    from its merged document (flags included).

    Raises:
        EtlError: no sources, weights on some sources only, a bad or repeated name.
    """
    from etl.errors import EtlError

    entries = doc["sources"]
    if not entries:
        raise EtlError("config: sources is empty; list at least one source, or leave sources out and give SRC")
    weighted = [e.get("weight") is not None for e in entries]
    if any(weighted) and not all(weighted):
        missing = ", ".join(f"sources[{i}]" for i, w in enumerate(weighted) if not w)
        raise EtlError(f"config: {missing} without a weight; give every source a weight, or none "
                       "(then each source's epochs, default 1, sets how often it is repeated)")
    if not any(weighted) and "mix_total" in doc:
        raise EtlError("config: mix_total sizes a weighted mixture; give the sources weights, or remove it")
    sources: list[MixSource] = []
    for i, entry in enumerate(entries):
        name = check_name(entry.get("name") or default_name(entry["path"]), f"sources[{i}]")
        if any(s.name == name for s in sources):
            raise EtlError(f"config: sources[{i}] is named {name!r} like an earlier source; give each "
                           "source a distinct name (it prefixes source_file and ids)")
        try:
            config = source_config(merged_doc(doc, entry))
        except EtlError as exc:
            raise EtlError(f"{exc} (in sources[{i}], {name})") from None
        sources.append(MixSource(name=name, path=entry["path"], domain=entry.get("domain") or name,
                                 weight=entry.get("weight"), epochs=entry.get("epochs"), config=config))
    return Mixture(tuple(sources), seed=doc.get("seed", 0), mix_by=doc.get("mix_by", "tokens"),
                   mix_total=doc.get("mix_total", "sum"))
