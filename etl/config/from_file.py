"""Turn a config file (seed 004 schema + etl sections) and command-line flags into a `RunConfig`.

Precedence: built-in defaults < config file < flags. Every key is checked against the schema
derived from the declarations (etl.config.models): an unknown key or a bad value names the
field and what is allowed. What is left here is how keys combine: seed 004's mask rules, the
text filters and domain key that its builders read, the defaults that follow the input type.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from etl.config.fields import declared
from etl.config.flags import flag_values
from etl.config.mixture import DEFAULT_MASK, mixture_from_doc
from etl.config.models import builder_options, check_file
from etl.config.run_config import (
    CANONICAL_ROLES,
    FIELD_ROLES,
    MaskOptions,
    RunConfig,
    load_config_file,
)
from etl.errors import EtlError

# Keys the generic path -> field mapping leaves to config_from_dict below.
_COMBINED = {"input.type", "truncation.policy"}


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
    # Without mask, its default rule (assistant trained); mask_default covers the other roles.
    mask = doc.get("mask", DEFAULT_MASK)
    roles = train_roles(mask, doc.get("mask_default", "mask"), input_type)
    return MaskOptions(train_roles=roles, **doc.get("mask_options", {}))


def _given(doc: dict[str, Any], path: str) -> tuple[bool, Any]:
    """(whether the file sets the dotted key, its value)."""
    *sections, key = path.split(".")
    for section in sections:
        doc = doc.get(section, {})
    return key in doc, doc.get(key)


def config_from_dict(doc: dict[str, Any]) -> dict[str, Any]:
    """RunConfig keyword arguments from a parsed config document: the keys it sets, checked."""
    check_file(doc)
    inp = dict(doc.get("input", {}))
    input_type = inp.pop("type", "chat")
    pre, out = doc.get("preprocessing", {}), doc.get("output", {})
    options = builder_options(input_type)
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
        truncation = truncation.get("policy", "drop_oldest_turns")
    kwargs: dict[str, Any] = {
        "input_type": input_type, "input_options": inp, "mask": _mask_options(doc, input_type),
        "truncation": truncation,
    }
    for d in declared(RunConfig):
        path = d.setting.path
        if path and path not in _COMBINED:
            given, value = _given(doc, path)
            if given and not (value is None and d.setting.null_is_default):
                kwargs[d.attr] = value
    if "seq_len" not in kwargs and pre.get("max_seq_len") is not None:  # seed 004's name for it
        kwargs["seq_len"] = pre["max_seq_len"]
    if input_type == "text":
        kwargs["default_system"] = None
    return kwargs


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """Defaults < config file < flags (which a mixture's every source takes too)."""
    doc = load_config_file(args.config) if getattr(args, "config", None) else {}
    config = _with_flags(config_from_dict(doc) if doc else {}, args)
    if doc.get("sources") is None:
        return config
    return dataclasses.replace(config, mixture=mixture_from_doc(doc, lambda d: _with_flags(config_from_dict(d), args)))


def _with_flags(kwargs: dict[str, Any], args: argparse.Namespace) -> RunConfig:
    kwargs = {**kwargs, **flag_values(args)}
    if getattr(args, "input_type", None) == "text":
        kwargs["default_system"] = None
        kwargs.setdefault("truncation", "right")
        kwargs["mask"] = MaskOptions(train_roles=("text",))
    if getattr(args, "no_default_system", False):
        kwargs["default_system"] = None
    try:
        return dataclasses.replace(RunConfig(), **kwargs)
    except TypeError as exc:
        raise EtlError(f"config: {exc}") from exc
