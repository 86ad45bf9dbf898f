"""The config file's checking model, its JSON Schema (`etl config --schema`) and the key
table (`etl config`), from the file's declaration (etl.config.file).

The model is the declaration with `input` one model per input type (its options the builder's
keyword arguments, told apart by `input.type`) and each of `sources` taking the per-source
options. It only checks: etl.config.build reads the document itself, so values reach the
manifest as the file wrote them.
"""

from __future__ import annotations

import functools
import inspect
import operator
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import (
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    create_model,
)
from pydantic.json_schema import GenerateJsonSchema

from etl.config import declare as d
from etl.config.file import SOURCE_OPTIONS, ConfigFile, Input, MaskKey, Preprocessing, SourceKeys
from etl.errors import EtlError
from etl.formats.base import RUN_ARGS
from etl.formats.builders import BUILDERS

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
_ERROR_NAMES = {"mask_default": "mask.mask_default"}  # mask_default is the rule of `mask`


def builder_options(input_type: str) -> dict[str, inspect.Parameter]:
    """The options of an input type: its builder's keyword arguments (less those the run supplies)."""
    params = inspect.signature(BUILDERS[input_type], eval_str=True).parameters
    return {name: p for name, p in params.items() if p.kind is p.KEYWORD_ONLY and name not in RUN_ARGS}


def _option(p: inspect.Parameter, input_type: str) -> tuple[Any, Any]:
    """Any value passes (the builder checks its options, with its own messages); the schema shows
    the type of the builder's argument, where pydantic can render it."""
    try:
        shown = TypeAdapter(p.annotation).json_schema()
    except Exception:  # noqa: BLE001
        shown = {}
    return Annotated[Any, WithJsonSchema(shown)], Field(p.default, description=f"option of input.type {input_type}")


@functools.cache
def _input_models() -> dict[str, Any]:
    """input.type -> the model of `input` for that type: `type` and the builder's options."""
    doc = Input.model_fields["type"].description
    return {name: create_model(f"input_{name}", __config__=ConfigFile.model_config,
                               type=(Literal[name], Field(name if name == "chat" else ..., description=doc)),
                               **{k: _option(p, name) for k, p in builder_options(name).items()})
            for name in sorted(BUILDERS)}


def _input_tag(value: Any) -> str:
    tag = value.get("type", "chat") if isinstance(value, dict) else "chat"  # chat's: must be an object
    return tag if isinstance(tag, str) else repr(tag)


@functools.cache
def _file_model() -> Any:
    """The model that checks a config file: the declaration, with `input` and `sources` complete."""
    variants = [Annotated[model, Tag(name)] for name, model in _input_models().items()]
    union = Annotated[functools.reduce(operator.or_, variants), Discriminator(_input_tag)]
    fields = ConfigFile.model_fields
    shared = {k: (union if k == "input" else fields[k].annotation, fields[k]) for k in SOURCE_OPTIONS if k in fields}
    max_items = Preprocessing.model_fields["max_items"]
    source = create_model("source", __base__=SourceKeys, **shared, max_items=(max_items.annotation, max_items))
    return create_model("etl_config", __base__=ConfigFile, __doc__=ConfigFile.__doc__, input=(union, fields["input"]),
                        sources=(list[source] | None, fields["sources"]))  # type: ignore[valid-type]


def check_file(doc: Any) -> None:
    """Check a parsed config document against the file's model.

    Raises:
        EtlError: one line naming the first bad key (dotted, as in the file) and what is allowed.
    """
    try:
        _file_model().model_validate(doc)
    except ValidationError as exc:
        raise EtlError(_message(exc.errors()[0])) from None


def _message(err: Any) -> str:
    """One line for a pydantic error of the file's model, its key as the file spells it."""
    loc, where, model = [str(part) for part in err["loc"]], "", _file_model()
    if loc[:1] == ["sources"] and len(loc) > 2 and loc[1].isdigit():  # a key of one source's table
        where, loc, model = f"sources[{loc[1]}].", loc[2:], d.model_of(model.model_fields["sources"].annotation)
    if err["type"] == "union_tag_invalid":
        return d.not_allowed(f"{where}input.type", err["input"].get("type"), sorted(BUILDERS))
    tag = loc.pop(1) if loc[:1] == ["input"] and len(loc) > 1 else None  # the input type's model
    if loc[-1:] == ["[key]"]:  # a dict key outside its Literal: mask.<role>
        loc.pop()
        err = {**err, "type": "extra_forbidden"}
    name, fields = ".".join(loc) or "config", _fields(model, loc[:-1], tag)
    if err["type"] == "extra_forbidden":
        allowed = get_args(MaskKey) if loc[:1] == ["mask"] else [f.alias or k for k, f in fields.items()]
        return d.unknown_key(where + name if where or len(loc) > 1 else f"config.{name}", allowed)
    mask_rule = loc[:1] == ["mask"] and len(loc) > 1  # mask.<role>: typed as mask_default
    info = ConfigFile.model_fields["mask_default"] if mask_rule else fields.get(loc[-1]) if loc else None
    # A section's own errors (not an object) name no type.
    return d.describe(err, where + _ERROR_NAMES.get(name, name), info if d.key_of(info) else None)


def _fields(model: Any, parts: list[str], tag: str | None) -> dict[str, Any]:
    """The fields of the section at `parts` of `model` (`input`: the model of input type `tag`)."""
    for part in parts:
        model = _input_models()[tag] if part == "input" and tag else d.model_of(model.model_fields[part].annotation)
    return model.model_fields if model is not None else {}  # mask: a dict


class _NoFieldTitles(GenerateJsonSchema):
    """No "title": "Max Items" per key: editors show the key and its description."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a config file."""
    return {"$schema": SCHEMA_DIALECT, **_file_model().model_json_schema(schema_generator=_NoFieldTitles)}


def _type_cell(annotation: Any) -> str:
    """`integer or null`, `"a" "b"` (the allowed values), ..."""
    inner, nullable = d.optional(annotation)
    if allowed := d.choices(inner):
        text = " ".join(f"`{d.show(v)}`" for v in allowed)
    elif get_origin(inner) is dict:  # mask: role -> rule
        text = f"object of {_type_cell(get_args(inner)[1])}"
    else:
        text = {bool: "boolean", int: "integer", float: "number", str: "string"}.get(inner, str(inner))
    return text + " or null" * nullable


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def _setting_row(name: str, info: Any, type_text: str = "") -> str:
    flag = f"`{k.flag}`" if (k := d.key_of(info)) and k.flag else ""
    default = "required" if info.is_required() else f"`{d.show(info.default)}`"
    return _row(f"`{name}`", type_text or _type_cell(d.declared_type(info)), default, flag, info.description)


def markdown_table() -> str:
    """The file's keys as a Markdown table (docs/config.md), one line per key in the
    declaration's order; `input.*` rows list each type's options."""
    types = sorted(BUILDERS)
    lines = [_row("key", "type or values", "default", "flag", "meaning"), "|---|---|---|---|---|"]
    for name, info in list(ConfigFile.model_fields.items())[1:]:  # after $schema
        if name == "input":
            lines.append(_setting_row("input.type", Input.model_fields["type"], " ".join(f"`{d.show(t)}`" for t in types)))
            lines += [_row("`input.*`", f"type `{t}`", "", "", f"options: {', '.join(builder_options(t))}") for t in types]
        elif name == "sources":
            lines += [_setting_row(f"sources[].{k}", f) for k, f in SourceKeys.model_fields.items()]
            lines.append(_row("`sources[].*`", "", "", "", "per-source options, as at the top level (which they "
                              f"extend, key by key): {', '.join(SOURCE_OPTIONS)}"))
        elif section := d.model_of(info.annotation):
            lines += [_setting_row(f"{name}.{k}", f) for k, f in section.model_fields.items()]
        else:
            lines.append(_setting_row(name, info))
    return "\n".join(lines) + "\n"
