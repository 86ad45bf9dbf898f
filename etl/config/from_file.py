"""The run's config, built once from a config file, flags or both: `config_from_args`.

Precedence: built-in defaults < config file < flags. The file is checked against its model
(etl.config.schema); its keys then become RunConfig's, which checks the flags' values too. What
is left here is how keys combine: the mask rules, the text filters the text builder reads, the
defaults that follow the input type. The result is frozen: a run reads no flag or file again.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import tomllib

from etl.config.declare import declared
from etl.config.file import CANONICAL_ROLES, DEFAULT_MASK, FIELD_ROLES
from etl.config.flags import flag_values
from etl.config.mixture import mixture_from_doc
from etl.config.run_config import MaskOptions, RunConfig
from etl.config.schema import builder_options, check_file
from etl.errors import EtlError

_COMBINED = {"input.type", "truncation.policy"}  # keys config_from_dict reads itself


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
    input_type, pre = inp.pop("type", "chat"), doc.get("preprocessing", {})
    for key in ("min_chars", "max_chars"):  # the declarative schema's text filters: builder options
        if key in pre:
            if key not in builder_options(input_type):
                raise EtlError(f"config: preprocessing.{key} applies to input.type text only")
            inp[key] = pre[key]
    # Pretraining text has no turns to drop: it keeps its first seq_len tokens.
    truncation = doc.get("truncation", "right" if input_type == "text" else "drop_oldest_turns")
    if isinstance(truncation, dict):
        truncation = truncation.get("policy", "drop_oldest_turns")
    # Without mask, its default rule (assistant trained); mask_default covers the other roles.
    roles = train_roles(doc.get("mask", DEFAULT_MASK), doc.get("mask_default", "mask"), input_type)
    kwargs: dict[str, Any] = {"input_type": input_type, "input_options": inp, "truncation": truncation,
                              "mask": MaskOptions(train_roles=roles, **doc.get("mask_options", {}))}
    for attr, _, k in declared(RunConfig):
        if k.path and k.path not in _COMBINED:
            given, value = _given(doc, k.path)
            if given and not (value is None and k.null_is_default):
                kwargs[attr] = value
    if "seq_len" not in kwargs and pre.get("max_seq_len") is not None:  # the declarative schema's name
        kwargs["seq_len"] = pre["max_seq_len"]
    if input_type == "text":
        kwargs["default_system"] = None
    return kwargs


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run's finished config: defaults < config file (`args.config`) < flags, which a
    mixture's every source takes too.

    Raises:
        EtlError: one line naming the first bad key or flag and what is allowed.
    """
    doc = _load_config_file(args.config) if getattr(args, "config", None) else {}
    config = _with_flags(config_from_dict(doc) if doc else {}, args)
    if doc.get("sources") is None:
        return config
    return config.replace(mixture=mixture_from_doc(doc, lambda d: _with_flags(config_from_dict(d), args)))


def _with_flags(kwargs: dict[str, Any], args: argparse.Namespace) -> RunConfig:
    kwargs = {**kwargs, **flag_values(args)}
    if getattr(args, "input_type", None) == "text":
        kwargs["default_system"] = None
        kwargs.setdefault("truncation", "right")
        kwargs["mask"] = MaskOptions(train_roles=("text",))
    if getattr(args, "no_default_system", False):
        kwargs["default_system"] = None
    return RunConfig(**kwargs)
