"""How a setting is declared once: a dataclass field whose metadata says where it lives.

A field of `RunConfig`, `MaskOptions` or `FileKeys` (etl.config.run_config) carries its type
(the annotation), its default, and a `Setting`: its dotted key in the config file, a one-line
doc, its `etl run` flag and its bounds. Everything else reads them from here: the pydantic
models that check files and flags (etl.config.models), the flags and their --help
(etl.config.flags), the JSON Schema and the README table (etl.config.reference).

This module imports nothing heavy: `etl run --help` builds its flags from it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import operator
import types
import typing
from typing import Any, Literal, NamedTuple

MIB = 1 << 20


# NamedTuples, not dataclasses: each dataclass costs ~1 ms to create, on every `etl` start.
class Limit(NamedTuple):
    """Bounds of a number, and the error that names them (`{value}` is the value given)."""

    message: str
    ge: float | None = None
    gt: float | None = None
    lt: float | None = None


class Setting(NamedTuple):
    """Where a field lives in the config file and what it means."""

    path: str | None  # dotted key in the config file; None: set by a flag only
    doc: str  # one line: --help, the README table and the JSON Schema's description
    flag: str | None = None  # the `etl run` / `etl check-template` flag that sets it
    limit: Limit | None = None
    mib: bool = False  # the flag takes MiB, the field holds bytes
    null_is_default: bool = False  # `null` in a file means "not given" (as before pydantic)


def setting(default: Any, path: str | None, doc: str, **options: Any) -> Any:
    """A dataclass field declared with its `Setting`; mutable defaults go in as factories."""
    meta = {"etl": Setting(path, doc, **options)}
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


class Declared(NamedTuple):
    """One declared field: attribute name, resolved type, default and `Setting`."""

    attr: str
    annotation: Any
    default: Any
    setting: Setting

    @property
    def name(self) -> str:
        """What errors call it: the key in the file, or the attribute for flag-only fields."""
        return self.setting.path or self.attr


@functools.cache
def declared(cls: type) -> tuple[Declared, ...]:
    """The fields of a dataclass that carry a `Setting`, in declaration order (resolved once)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if "etl" in f.metadata:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            out.append(Declared(f.name, hints[f.name], default, f.metadata["etl"]))
    return tuple(out)


def optional(annotation: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) < len(typing.get_args(annotation)):
            return functools.reduce(operator.or_, args), True
    return annotation, False


def choices(annotation: Any) -> tuple[Any, ...]:
    """The allowed values of a Literal type (None stripped), else ()."""
    inner, _ = optional(annotation)
    return typing.get_args(inner) if typing.get_origin(inner) is Literal else ()


_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def type_words(annotation: Any) -> str:
    """'an integer or null', ... as errors say it."""
    inner, nullable = optional(annotation)
    return _WORDS.get(inner, "a value") + (" or null" if nullable else "")


def show(value: Any) -> str:
    """A default as the file spells it (JSON)."""
    return json.dumps(value, ensure_ascii=False)
