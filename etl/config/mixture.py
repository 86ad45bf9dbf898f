"""A mixture: several sources in one run, each with its own input and options, mixed by weight.

`sources` in a config file is a list of tables (TOML `[[sources]]`). Each names a `path` and may
set the per-source options of `SOURCE_OPTIONS`; what it leaves out falls back to the file's top
level, key by key (a source's `input` without a `type` extends the top level's input; with another
type it stands alone). Run-wide settings (tokenizer, template, seq_len, split, dedup) stay at the
top level. The keys are declared with the file's (etl.config.file); how the sources are mixed is
the mixture planner's (etl.mixture); this module resolves the sources.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from etl.config.declare import Section, setting
from etl.config.file import DEFAULT_MASK, SOURCE_OPTIONS, ConfigFile, MixBy, MixTotal
from etl.errors import EtlError

MIX_KEYS = ("sources", "seed", "mix_by", "mix_total")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class MixSource(Section):
    """One source of a mixture, resolved from its checked `sources` entry (etl.config.file.SourceKeys):
    its name, domain, mixing rule (numbers as written) and whole run config."""

    name: str
    path: str
    domain: str
    weight: int | float | None
    epochs: int | float | None
    config: Any  # its RunConfig (etl.config.run_config imports this module)


class Mixture(Section):
    """The sources of a mixture and how they are mixed."""

    sources: tuple[MixSource, ...]
    seed: int = setting(ConfigFile, "seed")
    mix_by: MixBy = setting(ConfigFile, "mix_by")
    mix_total: MixTotal = setting(ConfigFile, "mix_total")

    def to_json(self) -> dict[str, Any]:
        """For the manifest: each source with its whole config."""
        return {"seed": self.seed, "mix_by": self.mix_by, "mix_total": self.mix_total,
                "sources": [{**s.model_dump(exclude={"config"}), "config": s.config.to_json()} for s in self.sources]}


def _default_name(path: str) -> str:
    """A source's name from its path: the file's stem without its extensions, or the folder's."""
    p = Path(path.rstrip("/"))
    stem = p.name.split(".")[0] if "." in p.name and not p.name.startswith(".") else p.name
    return stem if _NAME.fullmatch(stem or "") else "source"


def _merged_doc(top: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """The config document of one source: the top level's, with the entry's options over it key by key."""
    doc = {k: v for k, v in top.items() if k not in MIX_KEYS}
    for opt in (k for k in SOURCE_OPTIONS if k in entry):
        value = entry[opt]
        if opt == "max_items":  # the source's records' preprocessing.max_items
            doc["preprocessing"] = {**doc.get("preprocessing", {}), opt: value}
        elif opt == "input" and isinstance(value, dict):  # else the schema says it must be an object
            top_input = doc.get("input", {})
            same = value.get("type", top_input.get("type", "chat")) == top_input.get("type", "chat")
            doc[opt] = {**top_input, **value} if same else value
        elif opt == "mask" and isinstance(value, dict):
            doc[opt] = {**doc.get("mask", DEFAULT_MASK), **value}
        elif isinstance(value, dict) and isinstance(doc.get(opt), dict):
            doc[opt] = {**doc[opt], **value}
        else:
            doc[opt] = value
    return doc


def mixture_from_doc(doc: dict[str, Any], source_config: Callable[[dict[str, Any]], Any]) -> Mixture:
    """The mixture a checked config document declares; `source_config` makes a source's RunConfig
    from its merged document (flags included).

    Raises:
        EtlError: no sources, weights on some sources only, a bad or repeated name.
    """
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
        name = entry.get("name") or _default_name(entry["path"])
        if not _NAME.fullmatch(name):
            raise EtlError(f"config: sources[{i}].name {name!r} must be letters, digits, '_', '.' or '-' "
                           "(it prefixes source_file and ids)")
        if any(s.name == name for s in sources):
            raise EtlError(f"config: sources[{i}] is named {name!r} like an earlier source; give each "
                           "source a distinct name (it prefixes source_file and ids)")
        try:
            config = source_config(_merged_doc(doc, entry))
        except EtlError as exc:
            raise EtlError(f"{exc} (in sources[{i}], {name})") from None
        sources.append(MixSource(name=name, path=entry["path"], domain=entry.get("domain") or name,
                                 weight=entry.get("weight"), epochs=entry.get("epochs"), config=config))
    return Mixture(sources=tuple(sources), **{k: doc[k] for k in MIX_KEYS[1:] if k in doc})
