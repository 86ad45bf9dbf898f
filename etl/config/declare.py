"""How a setting is declared once, and how a bad value is told in one line.

A section of the config file is a `Section` (frozen, strict pydantic); a setting is a field made
by `key(...)`: default, doc, bounds and the flag that sets it. A run's objects are `Settings`
with the same fields (`setting`), so a bad value anywhere is one line naming its key in the
file: `config: <dotted key> <what is wrong>; allowed: ...`.
"""

from __future__ import annotations

import copy
import json
import types
import typing
from typing import Any, Literal, NamedTuple, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

from etl.errors import EtlError

MIB = 1 << 20
_LIMIT_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"}
_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


class Key(NamedTuple):
    """What a setting carries besides its type, default and doc (in its field's metadata)."""

    flag: str | None = None  # the `etl run` / `etl check-template` flag that sets it
    limit: str | None = None  # the error of a value out of bounds: "must be ..., got {value}"
    mib: bool = False  # the flag takes MiB, the field holds bytes
    null_is_default: bool = False  # `null` in a file means "not given"
    path: str | None = None  # a run's field: its dotted key in the file (None: a flag only)


def key(default: Any, doc: str, *, ge: float | None = None, gt: float | None = None, lt: float | None = None,
        **where: Any) -> Any:
    """A setting. A bounded number is finite too: inf passed `gt=0` (a mixture weight of inf mixed 0 records)."""
    bounds = {name: v for name, v in (("ge", ge), ("gt", gt), ("lt", lt)) if v is not None}
    info = Field(default, description=doc, **bounds, **({"allow_inf_nan": False} if bounds else {}))
    info.metadata.append(Key(**where))
    return info


def key_of(info: FieldInfo | None) -> Key | None:
    return next((m for m in info.metadata if isinstance(m, Key)), None) if info else None


def model_of(annotation: Any) -> Any:
    """The model inside a field's type (`X`, `X | None`, `list[X]`, `Annotated[X, ...]`), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for arg in typing.get_args(annotation) if (m := model_of(arg))), None)


def setting(section: type[BaseModel], path: str) -> Any:
    """The setting at the dotted `path` of a section, as a field of a run's object."""
    *parts, leaf = path.split(".")
    for part in parts:
        section = model_of(section.model_fields[part].annotation)
    info = copy.copy(section.model_fields[leaf])
    info.metadata = [m._replace(path=path) if isinstance(m, Key) else m for m in info.metadata]
    return info


class Section(BaseModel):
    """Frozen and strict: "false" is not false, 1.5 and true are not integers (a JSON or TOML
    typo would pass as something else), an unknown key is an error."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Settings(Section):
    """A run's object: a bad value raises one line naming its key in the file."""

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            err, fields = exc.errors()[0], type(self).model_fields
            if (attr := str(err["loc"][0])) not in fields:
                raise EtlError(unknown_key(attr, fields)) from None
            raise EtlError(describe(err, getattr(key_of(fields[attr]), "path", None) or attr, fields[attr])) from None

    def replace(self, **changes: Any) -> Self:
        """A copy with `changes`, checked as a new one is (`model_copy` checks nothing).

        Only the fields this one was given, and `changes`, are passed: the copy's
        `model_fields_set` still tells a setting the user gave from a default that the run may
        resolve later (`default_system`: the template's own unless given).
        """
        return type(self)(**{**{name: getattr(self, name) for name in self.model_fields_set}, **changes})


def optional(annotation: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        rest = tuple(a for a in args if a is not type(None))
        return (rest[0] if len(rest) == 1 else typing.Union[rest]), True  # noqa: UP007
    return annotation, False


def declared_type(info: FieldInfo) -> Any:
    """A setting's type as errors and the key table name it: a null that means "not given" is not shown."""
    return optional(info.annotation)[0] if getattr(key_of(info), "null_is_default", False) else info.annotation


def choices(annotation: Any) -> tuple[Any, ...]:
    """The allowed values of a Literal type (None stripped), else ()."""
    inner, _ = optional(annotation)
    return typing.get_args(inner) if typing.get_origin(inner) is Literal else ()


def show(value: Any) -> str:
    """A default as the file spells it (JSON)."""
    return json.dumps(value, ensure_ascii=False)


def describe(err: Any, name: str, info: FieldInfo | None = None) -> str:
    """One line for one pydantic error at the value `name`, declared by `info` (None: a section's
    own error, which names no type)."""
    kind, value, limit = err["type"], err["input"], getattr(key_of(info), "limit", None)
    if kind == "missing":
        return f"config: {name} is required"
    if kind in ("model_type", "dict_type"):
        return f"config: {name} must be an object, got {value!r}"
    if kind in _LIMIT_ERRORS and limit is not None:
        return f"config: {name} {limit.format(value=value)}"
    if kind == "literal_error":
        return not_allowed(name, value, choices(info.annotation if info else None))
    if kind.endswith("_type") and info is not None:
        inner, nullable = optional(declared_type(info))
        return f"config: {name} must be {_WORDS.get(inner, 'a value')}{' or null' * nullable}, got {value!r}"
    return f"config: {name}: {err['msg']}"


def not_allowed(name: str, value: Any, allowed: Any) -> str:
    return f"config: {name} is {value!r}; allowed: {', '.join(map(str, allowed))}"


def unknown_key(name: str, allowed: Any) -> str:
    return f"config: unknown key {name}; allowed: {', '.join(sorted(allowed))}"
