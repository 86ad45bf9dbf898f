"""Where etl's code points to the docs (`docs/design.md, Measured costs`), the page and its section
exist: the measured figures live in the docs, and a pointer to a renamed section would lose them.

A section is a heading (`## Measured costs`) or a paragraph's bold lead (`**Start-up.**`).
"""

from __future__ import annotations

import re

from tests.test_layout import PACKAGE

DOCS = PACKAGE.parent / "docs"
# `docs/page.md`, then maybe `, Section` (the pointer may wrap onto a comment's next line).
POINTER = re.compile(r"docs/([\w-]+\.md)(?:,\s*(?:#\s*)?([A-Z][\w-]*(?: [a-z][\w-]*)*))?")


def pointers() -> set[tuple[str, str | None, str]]:
    """(page, section or None, the file that points) for every pointer under etl/."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for page, section in POINTER.findall(path.read_text(encoding="utf-8")):
            found.add((page, section or None, str(path.relative_to(PACKAGE.parent))))
    return found


def sections(page: str) -> set[str]:
    text = (DOCS / page).read_text(encoding="utf-8")
    return {*re.findall(r"(?m)^#+ (.+?)\s*$", text), *re.findall(r"\*\*([^*]+?)\.\*\*", text)}


def test_code_points_to_pages_and_sections_that_exist() -> None:
    found = pointers()
    assert any(section == "Measured costs" for _, section, _ in found)
    broken = sorted(f"{where}: docs/{page}" + (f", {section}" if section else "")
                    for page, section, where in found
                    if not (DOCS / page).is_file() or (section and section not in sections(page)))
    assert not broken, "pointers to a missing page or section:\n" + "\n".join(broken)
