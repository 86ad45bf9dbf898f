"""The package map of docs/design.md names every module of etl/, and no module that is gone.

The map is the first code block of the page that starts with `etl/`: a line indented at most two
spaces opens a folder's entry (`etl/` the top level, `ui/`, `loader/`, ...; `loader/pairs/` may have
its own), deeper lines continue it. A module is named in its folder's entry as `stem.py`; a module
of a subfolder without an entry of its own is named in the entry above it as `sub/stem.py`.
"""

from __future__ import annotations

import re

import pytest

from tests.test_layout import LAYERS, PACKAGE

DESIGN = PACKAGE.parent / "docs" / "design.md"
_OPENS = re.compile(r"( {0,2})([a-z_][\w/]*)/(?: {2,}|$)")  # `  ui/        console.py ...`
_NAMED = re.compile(r"(?<![\w./])([\w/]+)\.py\b")


def design_map() -> dict[str, str]:
    """Folder (relative to etl/, "" for the top level) -> the text of its entry in the map."""
    blocks = re.findall(r"^```\n(.*?)^```$", DESIGN.read_text(encoding="utf-8"), flags=re.DOTALL | re.MULTILINE)
    block = next(b for b in blocks if b.startswith("etl/"))
    entries: dict[str, str] = {}
    folder = ""
    for line in block.splitlines():
        if len(line) - len(line.lstrip()) <= 2:
            opens = _OPENS.match(line)
            assert opens, f"docs/design.md map: {line!r} neither opens a folder's entry nor continues one"
            folder = "" if opens[2] == "etl" else opens[2]
            assert folder not in entries, f"docs/design.md map: {opens[2]}/ has two entries"
            line = line[opens.end():]
        entries[folder] = f"{entries.get(folder, '')} {line.strip()}"
    return entries


def package_modules(folders: set[str]) -> dict[str, set[str]]:
    """Folder of the map -> the modules it should name: each module under the deepest folder that
    has an entry, as its path below that folder without `.py` (`__init__`, `__main__` left out)."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.stem in ("__init__", "__main__"):
            continue
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        depth = max(d for d in range(len(parts)) if d == 0 or "/".join(parts[:d]) in folders)
        found.setdefault("/".join(parts[:depth]), set()).add("/".join(parts[depth:]))
    return found


MAP = design_map()
MODULES = package_modules(set(MAP))


def test_map_lists_the_package_folders_in_layer_order() -> None:
    """Its folders are etl's folders (those holding modules), in tests/test_layout.py's LAYERS order."""
    top = [f for f in MAP if f and "/" not in f]
    folders = {p.relative_to(PACKAGE).parts[0] for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE}
    assert not sorted(folders - set(top)), f"docs/design.md map: give {sorted(folders - set(top))} an entry each"
    assert not sorted(set(top) - folders), f"docs/design.md map: etl has no {sorted(set(top) - folders)}"
    assert top == [name for name in LAYERS if name in top], "the map's folders are not in LAYERS order"


@pytest.mark.parametrize("folder", sorted(set(MAP) | set(MODULES)), ids=lambda f: f or "etl")
def test_map_names_each_module_of_the_folder(folder: str) -> None:
    named = set(_NAMED.findall(MAP.get(folder, "")))
    modules = MODULES.get(folder, set())
    where = f"docs/design.md map, {folder or 'etl'}/"
    assert not sorted(modules - named), f"{where}: name {sorted(modules - named)} (a few words each)"
    assert not sorted(named - modules), f"{where}: names {sorted(named - modules)}, which etl/{folder} lacks"
