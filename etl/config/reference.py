"""The config file's keys as a Markdown table (`etl config`, README "Config files"), from the declarations.

One row per key, in the schema's order: its type or allowed values, its default as the file
spells it, the flag that overrides it, and its doc. `tests/config/test_schema.py` checks that
README.md holds this table as printed.
"""

from __future__ import annotations

from typing import Any, get_args, get_origin

from etl.config.fields import Declared, choices, optional, show
from etl.config.mixture import SOURCE_OPTIONS
from etl.config.models import builder_options
from etl.config.run_config import SECTIONS, file_settings
from etl.formats.registry import BUILDERS

_TYPE_NAMES = {bool: "boolean", int: "integer", float: "number", str: "string"}


def type_cell(annotation: Any) -> str:
    """`integer or null`, `"a", "b"` (the allowed values), ..."""
    inner, nullable = optional(annotation)
    allowed = choices(inner)
    if allowed:
        text = " ".join(f"`{show(v)}`" for v in allowed)
    elif isinstance(inner, type) and inner in _TYPE_NAMES:
        text = _TYPE_NAMES[inner]
    elif get_origin(inner) is dict:  # mask: role -> rule
        text = f"object of {type_cell(get_args(inner)[1])}"
    else:
        text = str(inner)
    return text + (" or null" if nullable else "")


def _line(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def _row(key: str, d: Declared, type_text: str | None = None) -> str:
    flag = f"`{d.setting.flag}`" if d.setting.flag else ""
    return _line(f"`{key}`", type_text or type_cell(d.annotation), f"`{show(d.default)}`", flag, d.setting.doc)


def markdown_table() -> str:
    """The table, with a header; one line per key, `input.*` rows listing each type's options."""
    groups = file_settings()
    lines = [_line("key", "type or values", "default", "flag", "meaning"), "|---|---|---|---|---|"]
    for section in SECTIONS:
        if section in groups[""]:
            lines.append(_row(section, groups[""][section]))
            continue
        for key, d in groups[section].items():
            path = f"{section}.{key}"
            if section == "sources":
                lines.append(_row(f"sources[].{key}", d))
                continue
            if path == "input.type":
                lines.append(_row(path, d, " ".join(f"`{show(name)}`" for name in sorted(BUILDERS))))
                lines += [_line("`input.*`", f"type `{name}`", "", "", f"options: {', '.join(builder_options(name))}")
                          for name in sorted(BUILDERS)]
            else:
                lines.append(_row(path, d))
        if section == "sources":
            lines.append(_line("`sources[].*`", "", "", "", f"per-source options, as at the top level (which they "
                               f"extend, key by key): {', '.join(SOURCE_OPTIONS)}"))
    return "\n".join(lines) + "\n"
