"""The run's config, built once from a config file, flags or both: `config_from_args`.

Precedence: built-in defaults < config file < flags. The file is checked against its model
(etl.config.schema); its keys then become RunConfig's, which checks the flags' values too. What
is left here is how keys combine: the mask rules, the text filters, the defaults that follow the
input type, a mixture's sources. The result is frozen: a run reads no flag or file again.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Any

import tomllib

from etl.config.declare import MIB, choices, key_of, optional, show
from etl.config.file import CANONICAL_ROLES, DEFAULT_MASK, FIELD_ROLES, SOURCE_OPTIONS
from etl.config.run_config import MaskOptions, Mixture, RunConfig, RunSettings, RunSource
from etl.errors import EtlError

# etl.config.schema (the file's checks, the builders' options) imports the input builders, so DuckDB,
# numpy and pyarrow: it is imported where a config is built, not here, so that `add_flags` (etl run's
# and etl check-template's --help) costs pydantic and the config models only (their cost:
# docs/design.md, Start-up; tests/commands/test_help_imports.py).

_KEYS = {attr: k for attr, info in RunConfig.model_fields.items() if (k := key_of(info))}  # attr -> Key
_COMBINED = {"input.type", "truncation.policy"}  # keys config_from_dict reads itself
_MIX_KEYS = ("sources", "seed", "mix_by", "mix_total")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _dest(flag: str | None) -> str:
    return str(flag).lstrip("-").replace("-", "_")  # `--max-record-mb` -> max_record_mb


def declared_flags() -> tuple[str, ...]:
    """RunConfig's settings that declare a flag (`key(..., flag=...)`), in declaration order:
    `etl run` takes every one, so a declared flag cannot be left off its command line."""
    return tuple(attr for attr, k in _KEYS.items() if k.flag)


def add_flags(p: argparse.ArgumentParser, attrs: tuple[str, ...] | None = None, **defaults: Any) -> None:
    """Add the flags of RunConfig's `attrs` (None: every declared flag, `etl run`'s; choices, type,
    help from their declarations); flags default to None so a config file's value stands;
    `defaults` gives a command its own default."""
    for attr in declared_flags() if attrs is None else attrs:
        info, k = RunConfig.model_fields[attr], _KEYS[attr]
        default = defaults.get(attr, info.default)
        shown = f"{default / MIB:g} MiB" if k.mib else (default if isinstance(default, str) else show(default))
        where = f" ({k.path} in a config)" if k.path and attr not in defaults else ""
        kind = float if k.mib else (int if optional(info.annotation)[0] is int else str)
        p.add_argument(k.flag, dest=_dest(k.flag), type=kind, choices=choices(info.annotation) or None,
                       default=defaults.get(attr), help=f"{info.description}; default {shown}{where}")


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """RunConfig keyword arguments from the flags given (MiB flags converted to bytes).

    Raises:
        EtlError: a MiB flag that is not a positive size.
    """
    out: dict[str, Any] = {}
    for attr, k in _KEYS.items():
        if k.flag is None or (value := getattr(args, _dest(k.flag), None)) is None:
            continue
        if k.mib:
            top = next((m.lt for m in RunConfig.model_fields[attr].metadata if hasattr(m, "lt")), math.inf)
            if not (math.isfinite(value) and 1 <= value * MIB < top):
                most = "" if top == math.inf else f", at most {(top - 1) / MIB:g}"
                raise EtlError(f"{k.flag} is {value:g}; pass a positive size in MiB{most}")
            value = int(value * MIB)
        out[attr] = value
    return out


def _load_config_file(path: str | Path) -> dict[str, Any]:
    """Parse a JSON or TOML config file (by extension; JSON otherwise)."""
    p = Path(path)
    if not p.is_file():
        raise EtlError(f"config file {path} not found")
    text = p.read_text(encoding="utf-8")
    try:
        return tomllib.loads(text) if p.suffix.lower() == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise EtlError(f"config file {path} is not valid {'TOML' if p.suffix == '.toml' else 'JSON'}: {exc}") from exc


def train_roles(mask: dict[str, str], mask_default: str, input_type: str) -> tuple[str, ...]:
    """Roles whose content is trained, from the file's `mask` rules and `mask_default`."""
    by_role = {FIELD_ROLES.get(key, key): action for key, action in mask.items()}
    if input_type == "text":  # pretraining text: no mask, every token trained
        return ("text",)
    return tuple(r for r in CANONICAL_ROLES if by_role.get(r, mask_default) == "train")


def config_from_dict(doc: dict[str, Any]) -> dict[str, Any]:
    """RunConfig keyword arguments from a parsed config document: the keys it sets, checked."""
    from etl.config.schema import check_file

    check_file(doc)
    return _config_kwargs(doc)


def _config_kwargs(doc: dict[str, Any]) -> dict[str, Any]:
    """RunConfig keyword arguments from a checked document (a source's: made of checked parts)."""
    from etl.config.schema import builder_options

    inp = dict(doc.get("input", {}))
    input_type, pre = inp.pop("type", "chat"), doc.get("preprocessing", {})
    for key in ("min_chars", "max_chars"):  # the declarative schema's text filters: builder options
        if key in pre:
            if key not in builder_options(input_type):
                raise EtlError(f"config: preprocessing.{key} applies to input.type text only")
            inp[key] = pre[key]
    _output_keys(doc.get("output", {}), inp, input_type)
    # Pretraining text has no turns to drop: it keeps its first seq_len tokens.
    truncation = doc.get("truncation", "right" if input_type == "text" else "drop_oldest_turns")
    if isinstance(truncation, dict):
        truncation = truncation.get("policy", "drop_oldest_turns")
    # Without mask, its default rule (assistant trained); mask_default covers the other roles.
    roles = train_roles(doc.get("mask", DEFAULT_MASK), doc.get("mask_default", "mask"), input_type)
    kwargs: dict[str, Any] = {"input_type": input_type, "input_options": inp, "truncation": truncation,
                              "mask": MaskOptions(train_roles=roles, **doc.get("mask_options", {}))}
    for attr, k in _KEYS.items():
        if k.path and k.path not in _COMBINED:
            *sections, leaf = k.path.split(".")
            section = doc
            for name in sections:
                section = section.get(name, {})
            if leaf in section and not (section[leaf] is None and k.null_is_default):
                kwargs[attr] = section[leaf]
    if "seq_len" not in kwargs and pre.get("max_seq_len") is not None:  # the declarative schema's name
        kwargs["seq_len"] = pre["max_seq_len"]
    if input_type == "text":
        kwargs["default_system"] = None
    return kwargs


def _output_keys(output: dict[str, Any], inp: dict[str, Any], input_type: str) -> None:
    """The declarative schema's `output` keys that are not settings of their own: `domain_key` is
    the input's option (added to `inp`), `max_tokens_per_shard` sizes the token files only.

    Raises:
        EtlError: output.domain_key other than input.domain_key, or for an input type without one;
            max_tokens_per_shard without storage_format (it would do nothing).
    """
    from etl.config.schema import builder_options

    if (name := output.get("domain_key")) is not None:
        if inp.get("domain_key", name) != name:
            raise EtlError(f"config: output.domain_key is {name!r} but input.domain_key is {inp['domain_key']!r}; "
                           "keep one of them (both name the record key of the example's domain)")
        if "domain_key" not in builder_options(input_type):
            raise EtlError(f"config: output.domain_key does not apply to input.type {input_type} (its records "
                           "carry no domain key); remove it")
        inp["domain_key"] = name
    if "max_tokens_per_shard" in output and output.get("storage_format") is None:
        raise EtlError("config: output.max_tokens_per_shard sizes the bin/h5 token files; set "
                       "output.storage_format to bin or h5, or remove it")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run's own config (a mixture's top level): defaults < config file < flags."""
    return _read(args)[2]


def settings_from_args(args: argparse.Namespace) -> RunSettings:
    """What `etl run` is asked for: its config (`config_from_args`), a mixture's sources, each
    with the flags over its own options, and SRC and DST from the positionals (a mixture's SRC is
    left out).

    Raises:
        EtlError: one line naming the first bad key or flag and what is allowed.
    """
    doc, flags, config = _read(args)
    src, dst = args.src, args.dst
    if doc.get("sources") is None:
        if src is None or dst is None:
            raise EtlError("etl run needs SRC and DST (or a config that lists sources, and DST); see etl run --help")
        return RunSettings.one(src, dst, config)
    sources = _sources(doc, lambda d: _run_config(_with_flags(d, flags), flags))
    if dst is not None:
        raise EtlError("the config lists sources, so SRC is left out: etl run --config FILE DST")
    if src is None:
        raise EtlError("etl run needs DST: etl run --config FILE DST")
    return RunSettings(src, sources, config, Mixture(**{k: doc[k] for k in _MIX_KEYS[1:] if k in doc}))


def _read(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any], RunConfig]:
    """(the config file's document, the flags given, the run's own config): the flags are written
    into the document at their keys and checked with it, once (etl.config.schema.check_file)."""
    from etl.config.schema import check_file

    doc = _load_config_file(args.config) if getattr(args, "config", None) else {}
    flags = flag_values(args)
    if getattr(args, "no_default_system", False):
        flags["default_system"] = None
    top = _with_flags(doc, flags)
    check_file(top)
    return doc, flags, _run_config(top, flags)


def _with_flags(doc: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """The document with each flag's value written at its key (the file's value under it)."""
    doc = {**doc}
    for attr, value in flags.items():
        if (path := _KEYS[attr].path) is None:
            continue  # a flag-only setting (--chunk-mb): not a key of the file
        *sections, leaf = path.split(".")
        if sections == ["truncation"] and not isinstance(doc.get("truncation", {}), dict):
            doc["truncation"] = {"policy": doc["truncation"]}  # a bare policy name: {policy = name}
        section = doc
        for name in sections:
            inner = section.get(name)
            section[name] = section = {**inner} if isinstance(inner, dict) else {}
        section[leaf] = value
    return doc


def _run_config(doc: dict[str, Any], flags: dict[str, Any]) -> RunConfig:
    """The RunConfig of a checked document with the flags written in, and the flag-only settings."""
    return RunConfig(**_config_kwargs(doc), **{attr: v for attr, v in flags.items() if _KEYS[attr].path is None})


def _merged_doc(top: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """One source's config document: the top level's, with the entry's options over it key by key
    (an `input` without a `type`, or with the same, extends the top level's; another type stands alone)."""
    doc = {k: v for k, v in top.items() if k not in _MIX_KEYS}
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


def _source_name(i: int, entry: dict[str, Any], earlier: list[RunSource]) -> str:
    """Its `name`, or its path's stem without extensions (a folder's name); distinct, file-safe."""
    p = Path(entry["path"].rstrip("/"))
    stem = p.name.split(".")[0] if "." in p.name and not p.name.startswith(".") else p.name
    name = entry.get("name") or (stem if _NAME.fullmatch(stem or "") else "source")
    if not _NAME.fullmatch(name):
        raise EtlError(f"config: sources[{i}].name {name!r} must be letters, digits, '_', '.' or '-' "
                       "(it prefixes source_file and ids)")
    if any(s.name == name for s in earlier):
        raise EtlError(f"config: sources[{i}] is named {name!r} like an earlier source; give each "
                       "source a distinct name (it prefixes source_file and ids)")
    return name


def _sources(doc: dict[str, Any], source_config: Any) -> tuple[RunSource, ...]:
    """The sources a checked document declares; `source_config` makes a source's RunConfig from its
    merged document (flags included).

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
    sources: list[RunSource] = []
    for i, entry in enumerate(entries):
        name = _source_name(i, entry, sources)
        try:
            config = source_config(_merged_doc(doc, entry))
        except EtlError as exc:
            raise EtlError(f"{exc} (in sources[{i}], {name})") from None
        sources.append(RunSource(entry["path"], config, name=name, domain=entry.get("domain") or name,
                                 weight=entry.get("weight"), epochs=entry.get("epochs")))
    return tuple(sources)
