"""The config file as pydantic models built from the declarations: it checks a file and gives
the JSON Schema that `etl config --schema` prints.

Sections and keys come from the `setting(...)` paths of RunConfig, MaskOptions and FileKeys;
`input` is one model per registered input type (its options read from the builder's keyword
arguments), told apart by `input.type`. The models only check: the settings are read from
the document itself (etl.config.from_file), so values and key order reach the manifest as
the file wrote them.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
)
from pydantic import create_model as _create_model
from pydantic.json_schema import GenerateJsonSchema

from etl.config.check import STRICT, describe, field_of, file_annotation, not_allowed, unknown_key
from etl.config.fields import Declared, Limit
from etl.config.mixture import SOURCE_OPTIONS
from etl.config.run_config import SECTIONS, MaskAction, MaskKey, Truncation, file_settings
from etl.errors import EtlError
from etl.formats.base import RUN_ARGS
from etl.formats.registry import BUILDERS

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
# seed 004's mask_default is the rule of `mask`; its errors have always been named mask.mask_default.
ERROR_NAMES = {"mask_default": "mask.mask_default"}


def create_model(model_name: str, /, **fields: Any) -> type[BaseModel]:
    """A strict pydantic model that forbids unknown keys."""
    return _create_model(model_name, __config__=STRICT, **fields)


def builder_options(input_type: str) -> dict[str, inspect.Parameter]:
    """The options of an input type: its builder's keyword arguments (less those the run supplies)."""
    params = inspect.signature(BUILDERS[input_type], eval_str=True).parameters
    return {name: p for name, p in params.items() if p.kind is p.KEYWORD_ONLY and name not in RUN_ARGS}


def _option(p: inspect.Parameter, input_type: str) -> tuple[Any, Any]:
    """Any value passes here (the builder checks its options with its own messages); the
    schema shows the type of the builder's argument."""
    try:
        shown = TypeAdapter(p.annotation).json_schema()
    except Exception:  # noqa: BLE001 (an annotation pydantic cannot render: the schema says nothing)
        shown = {}
    return Annotated[Any, WithJsonSchema(shown)], Field(p.default, description=f"option of input.type {input_type}")


def _input_tag(value: Any) -> str:
    if not isinstance(value, dict):
        return "chat"  # the chat model then says that input must be an object
    tag = value.get("type", "chat")
    return tag if isinstance(tag, str) else repr(tag)


def _input_field(decl: Declared) -> Any:
    """input: one model per input type, chosen by `type` (absent: the declared default, chat)."""
    variants = []
    for name in sorted(BUILDERS):
        kind = Literal[name]  # type: ignore[valid-type]
        tag = (kind, Field(name, description=decl.setting.doc)) if name == decl.default else (kind, ...)
        options = {key: _option(p, name) for key, p in builder_options(name).items()}
        variants.append(Annotated[create_model(f"input_{name}", type=tag, **options), Tag(name)])
    return Annotated[functools.reduce(lambda a, b: a | b, variants), Discriminator(_input_tag)]


def _policy(value: Any) -> Any:
    return value if isinstance(value, dict) else {"policy": value}


@dataclass(frozen=True)
class FileSchema:
    """The file model, the keys each section allows, and each key's type and bounds."""

    model: type[BaseModel]
    keys: dict[str, tuple[str, ...]]  # "config", "preprocessing", "input.chat", ... -> keys
    leaves: dict[str, tuple[Any, Limit | None]]  # "split.seed" -> (type, bounds)


@functools.cache
def file_schema() -> FileSchema:
    """The config file's model, built once from the declarations and the input types."""
    groups = file_settings()
    # Errors name the declared type: null where it means "not given" is tolerated, not advertised.
    leaves = {d.setting.path: (d.annotation, d.setting.limit) for g in groups.values() for d in g.values()}
    keys = {f"input.{name}": ("type", *builder_options(name)) for name in BUILDERS}
    fields: dict[str, Any] = {"schema_": (str | None, Field(None, alias="$schema", description=(
        "the JSON Schema of this file, for editors (`etl config --schema`); etl ignores it")))}
    for key, doc in SECTIONS.items():
        if key in groups[""]:
            d = groups[""][key]
            fields[key] = field_of(d, file_annotation(d))
        elif key == "input":
            fields[key] = (_input_field(groups["input"]["type"]), Field(default_factory=dict, description=doc))
        elif key == "sources":
            fields[key], keys[key] = _sources_field(groups, fields, doc)
        else:
            section = {k: field_of(d, file_annotation(d)) for k, d in groups[key].items()}
            keys[key] = tuple(section)
            model: Any = create_model(key, **section)
            if key == "truncation":  # a bare policy name stands for {policy = name}
                model = Annotated[model, BeforeValidator(_policy, json_schema_input_type=Truncation | model)]
            fields[key] = (model, Field(default_factory=dict, description=doc))
    keys["config"] = ("$schema", *SECTIONS)
    keys["mask"] = get_args(MaskKey)
    leaves |= {f"mask.{role}": (MaskAction, None) for role in keys["mask"]}
    root = create_model("etl_config", **fields)
    root.__doc__ = "An `etl run --config` file: seed 004's schema plus etl's own sections."
    return FileSchema(root, keys, leaves)


def _sources_field(
    groups: dict[str, dict[str, Declared]], fields: dict[str, Any], doc: str
) -> tuple[tuple[Any, Any], tuple[str, ...]]:
    """`sources`: a list of tables, each with its own keys and the per-source options, typed as at
    the top level (fields holds those already: `sources` comes after them in SECTIONS)."""
    own = {k: field_of(d, file_annotation(d)) for k, d in groups["sources"].items()}
    own["path"] = (str, Field(..., description=groups["sources"]["path"].setting.doc))
    options = {k: fields[k] for k in SOURCE_OPTIONS if k in fields}
    options["max_items"] = field_of(groups["preprocessing"]["max_items"])
    model = create_model("source", **own, **options)
    return (list[model] | None, Field(None, description=doc)), (*own, *options)  # type: ignore[valid-type]


def check_file(doc: Any) -> None:
    """Check a parsed config document against the schema.

    Raises:
        EtlError: one line naming the first bad key (dotted, as in the file) and what is allowed.
    """
    schema = file_schema()
    try:
        schema.model.model_validate(doc)
    except ValidationError as exc:
        raise EtlError(_message(exc.errors()[0], schema)) from None


def _message(err: Any, schema: FileSchema) -> str:
    loc = [str(part) for part in err["loc"]]
    where = ""
    if loc[:1] == ["sources"] and len(loc) > 2 and loc[1].isdigit():  # a key of one source's table
        where, loc = f"sources[{loc[1]}].", loc[2:]
    if err["type"] == "union_tag_invalid":
        return not_allowed(f"{where}input.type", err["input"].get("type"), sorted(BUILDERS))
    section = ""
    if loc[:1] == ["input"] and len(loc) > 1:
        section = f"input.{loc.pop(1)}"  # the union's tag: the input type
    if loc[-1:] == ["[key]"]:  # a dict key outside its Literal: mask.<role>
        loc.pop()
        err = {**err, "type": "extra_forbidden"}
    name = ".".join(loc) or "config"
    if err["type"] == "extra_forbidden":
        parent = ".".join(loc[:-1]) or ("sources" if where else "config")
        shown = where + name if where or len(loc) > 1 else f"config.{name}"
        return unknown_key(shown, schema.keys[section or parent])
    leaf = f"sources.{name}" if where and f"sources.{name}" in schema.leaves else name
    annotation, limit = schema.leaves.get(leaf, (None, None))
    return describe(err, where + ERROR_NAMES.get(name, name), annotation, limit)


class _NoFieldTitles(GenerateJsonSchema):
    """No "title": "Max Items" per key: editors show the key and its description."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a config file."""
    return {"$schema": SCHEMA_DIALECT, **file_schema().model.model_json_schema(schema_generator=_NoFieldTitles)}
