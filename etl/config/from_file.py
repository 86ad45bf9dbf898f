"""Turn a config file (seed 004 schema + etl sections) and command-line flags into a `RunConfig`.

Precedence: built-in defaults < config file < flags. Every key is checked: an unknown key or
a bad value names the field and what is allowed.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import math
from typing import Any

from etl.config.run_config import FIELD_ROLES, MaskOptions, RunConfig, load_config_file
from etl.errors import EtlError
from etl.formats.base import DEFAULT_MAX_RECORD_BYTES
from etl.formats.registry import BUILDERS

CANONICAL_ROLES = ("system", "user", "assistant", "tool", "text")
SECTIONS = {
    "version", "input", "mask", "mask_default", "preprocessing", "output", "template", "tokenizer",
    "seq_len", "truncation", "mask_options", "split", "default_system",
}
PREPROCESSING = {
    "max_seq_len", "min_chars", "max_chars", "deduplicate", "dedup_mode", "max_items", "add_bos", "add_eos",
    "max_record_bytes",
}
OUTPUT = {"domain_key", "storage_format", "max_tokens_per_shard"}
MASK_OPTIONS = {"train_header", "eot", "last_assistant_only", "require_complete_user"}
SPLIT = {"val_fraction", "seed"}


def _keys(section: str, given: dict[str, Any], allowed: set[str]) -> None:
    if not isinstance(given, dict):
        raise EtlError(f"config: {section} must be an object, got {type(given).__name__}")
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise EtlError(f"config: unknown key {section}.{unknown[0]}; allowed: {', '.join(sorted(allowed))}")


def _builder_options(input_type: str) -> set[str]:
    if input_type not in BUILDERS:
        raise EtlError(f"config: input.type is {input_type!r}; allowed: {', '.join(sorted(BUILDERS))}")
    params = inspect.signature(BUILDERS[input_type]).parameters
    return {name for name, p in params.items() if p.kind is p.KEYWORD_ONLY and name != "roles"}


def train_roles(mask: dict[str, str], mask_default: str, input_type: str) -> tuple[str, ...]:
    """Roles whose content is trained, from seed 004's `mask` rules and `mask_default`."""
    for key, action in {**mask, "mask_default": mask_default}.items():
        if action not in ("mask", "train"):
            raise EtlError(f"config: mask.{key} is {action!r}; allowed: mask, train")
    by_role = {FIELD_ROLES.get(key, key): action for key, action in mask.items()}
    if input_type == "text":  # seed 004 pretraining: no mask, every token trained
        return ("text",)
    return tuple(r for r in CANONICAL_ROLES if by_role.get(r, mask_default) == "train")


def _mask_options(doc: dict[str, Any], input_type: str) -> MaskOptions:
    opts = doc.get("mask_options", {})
    _keys("mask_options", opts, MASK_OPTIONS)
    mask = doc.get("mask")
    if mask is None:  # the default rule (assistant trained); mask_default covers the other roles
        default = {r: "train" for r in MaskOptions().train_roles}
        roles = train_roles(default, doc.get("mask_default", "mask"), input_type)
    else:
        _keys("mask", mask, set(CANONICAL_ROLES) | set(FIELD_ROLES))
        roles = train_roles(mask, doc.get("mask_default", "mask"), input_type)
    return MaskOptions(train_roles=roles, **opts)


def config_from_dict(doc: dict[str, Any]) -> dict[str, Any]:
    """RunConfig keyword arguments from a parsed config document."""
    _keys("config", doc, SECTIONS)
    for section in ("input", "mask", "preprocessing", "output", "mask_options", "split"):
        if section in doc and not isinstance(doc[section], dict):
            raise EtlError(f"config: {section} must be an object, got {doc[section]!r}")
    if doc.get("version", 1) != 1:
        raise EtlError(f"config: version is {doc['version']!r}; allowed: 1")
    inp = dict(doc.get("input", {}))
    input_type = inp.pop("type", "chat")
    pre = doc.get("preprocessing", {})
    out = doc.get("output", {})
    split = doc.get("split", {})
    _keys("preprocessing", pre, PREPROCESSING)
    _keys("output", out, OUTPUT)
    _keys("split", split, SPLIT)
    options = _builder_options(input_type)
    _keys("input", inp, options | {"type"})
    for key in ("min_chars", "max_chars"):  # seed 004 puts the text filters under preprocessing
        if key in pre:
            if key not in options:
                raise EtlError(f"config: preprocessing.{key} applies to input.type text only")
            inp[key] = pre[key]
    if out.get("domain_key") is not None and "domain_key" in options:
        inp["domain_key"] = out["domain_key"]
    # Pretraining text has no turns to drop: seed 004 keeps the first max_seq_len tokens.
    truncation = doc.get("truncation", "right" if input_type == "text" else "drop_oldest_turns")
    if isinstance(truncation, dict):
        _keys("truncation", truncation, {"policy"})
        truncation = truncation.get("policy", "drop_oldest_turns")
    kwargs: dict[str, Any] = {
        "input_type": input_type,
        "input_options": inp,
        "mask": _mask_options(doc, input_type),
        "truncation": truncation,
        "deduplicate": pre.get("deduplicate", False),
        "dedup_mode": pre.get("dedup_mode", "prefix200"),
        "max_items": pre.get("max_items"),
        "max_record_bytes": pre.get("max_record_bytes", DEFAULT_MAX_RECORD_BYTES),
        "add_bos": pre.get("add_bos", False),
        "add_eos": pre.get("add_eos", False),
        "domain_key": out.get("domain_key"),
        "storage_format": out.get("storage_format", "parquet"),
        "max_tokens_per_shard": out.get("max_tokens_per_shard", 100_000_000),
        "val_fraction": split.get("val_fraction", 0.0),
        "split_seed": split.get("seed", 0),
    }
    seq_len = doc.get("seq_len", pre.get("max_seq_len"))
    for key, value in (("template", doc.get("template")), ("tokenizer", doc.get("tokenizer")), ("seq_len", seq_len)):
        if value is not None:
            kwargs[key] = value
    if "default_system" in doc:
        kwargs["default_system"] = doc["default_system"]
    if input_type == "text":
        kwargs["default_system"] = None
    return kwargs


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """Defaults < config file < flags."""
    kwargs: dict[str, Any] = {}
    if getattr(args, "config", None):
        kwargs.update(config_from_dict(load_config_file(args.config)))
    for flag in ("tokenizer", "template", "seq_len"):
        value = getattr(args, flag, None)
        if value is not None:
            kwargs[flag] = value
    if getattr(args, "truncation", None):
        kwargs["truncation"] = args.truncation
    if getattr(args, "input_type", None):
        kwargs["input_type"] = args.input_type
        if args.input_type == "text":
            kwargs["default_system"] = None
            kwargs.setdefault("truncation", "right")
            kwargs["mask"] = MaskOptions(train_roles=("text",))
    if getattr(args, "no_default_system", False):
        kwargs["default_system"] = None
    if getattr(args, "chunk_mb", None) is not None:
        kwargs["chunk_bytes"] = int(args.chunk_mb * (1 << 20))
    if getattr(args, "max_record_mb", None) is not None:
        mb = args.max_record_mb
        if not (math.isfinite(mb) and mb * (1 << 20) >= 1):
            raise EtlError(f"--max-record-mb is {mb:g}; pass a positive size in MiB (records over it are rejected)")
        kwargs["max_record_bytes"] = int(mb * (1 << 20))
    try:
        return dataclasses.replace(RunConfig(), **kwargs)
    except TypeError as exc:
        raise EtlError(f"config: {exc}") from exc
