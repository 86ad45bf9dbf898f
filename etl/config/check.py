"""Declared settings as pydantic fields, a RunConfig checked by them, and errors as one line.

pydantic's ValidationError lists every error over several lines; etl reports the first as
`config: <dotted key> <what is wrong>; allowed: ...`, the key as the config file spells it.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Optional

from pydantic import ConfigDict, Field, ValidationError, create_model
from pydantic_core import ErrorDetails

from etl.config.fields import Declared, Limit, choices, declared, optional, type_words
from etl.errors import EtlError

# Strict: "false" is not false, 1.5 and true are not integers (a JSON or TOML typo would
# otherwise pass as something else). Unknown keys are errors.
STRICT = ConfigDict(strict=True, extra="forbid")
_LIMIT_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"}


def file_annotation(d: Declared) -> Any:
    """The type a config file may give: the field's, or null too where null means the default."""
    return Optional[d.annotation] if d.setting.null_is_default else d.annotation  # noqa: UP045


def field_of(d: Declared, annotation: Any = None) -> tuple[Any, Any]:
    """(type, FieldInfo) of a declared setting in a pydantic model: bounds, default, doc."""
    inner, nullable = optional(annotation if annotation is not None else d.annotation)
    if limit := d.setting.limit:
        # inf passes `gt=0` (TOML `inf`, JSON `1e999`: a weight of inf mixed 0 records and wrote
        # NaN to the manifest); a bounded number is finite, reported with the bound's message.
        inner = Annotated[inner, Field(ge=limit.ge, gt=limit.gt, lt=limit.lt, allow_inf_nan=False)]
    return (Optional[inner] if nullable else inner), Field(d.default, description=d.setting.doc)  # noqa: UP045


@functools.cache
def _flat_model(cls: type) -> Any:
    return create_model(cls.__name__, __config__=STRICT, **{d.attr: field_of(d) for d in declared(cls)})


def check(obj: Any) -> None:
    """Check a declared dataclass's values (a RunConfig or MaskOptions) against their declarations.

    Raises:
        EtlError: the first bad value, named by its key in the config file.
    """
    decls = {d.attr: d for d in declared(type(obj))}
    try:
        _flat_model(type(obj)).model_validate({attr: getattr(obj, attr) for attr in decls})
    except ValidationError as exc:
        err = exc.errors()[0]
        d = decls[str(err["loc"][0])]
        raise EtlError(describe(err, d.name, d.annotation, d.setting.limit)) from None


def describe(err: ErrorDetails, name: str, annotation: Any = None, limit: Limit | None = None) -> str:
    """One line for one pydantic error at the value `name` (a leaf or a section)."""
    kind, value = err["type"], err["input"]
    if kind == "missing":
        return f"config: {name} is required"
    if kind in ("model_type", "dict_type"):
        return f"config: {name} must be an object, got {value!r}"
    if kind in _LIMIT_ERRORS and limit is not None:
        return f"config: {name} {limit.message.format(value=value)}"
    if kind == "literal_error":
        return not_allowed(name, value, choices(annotation))
    if kind.endswith("_type") and annotation is not None:
        return f"config: {name} must be {type_words(annotation)}, got {value!r}"
    return f"config: {name}: {err['msg']}"


def not_allowed(name: str, value: Any, allowed: Any) -> str:
    return f"config: {name} is {value!r}; allowed: {', '.join(map(str, allowed))}"


def unknown_key(name: str, allowed: Any) -> str:
    return f"config: unknown key {name}; allowed: {', '.join(sorted(allowed))}"
