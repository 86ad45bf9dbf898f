"""The package's import graph is one-way: no module imports, even lazily, one that imports it.

Read from the source (every `import` statement, also those inside functions), so a cycle that
only a lazy import hides still fails here. Folders are stage families; a top-level module
(`columns`, `errors`, `ragged`, ...) is a node of its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "etl"
# Stage families from the bottom up: each may import only those before it (and top-level
# modules listed before it). What a newcomer should see in `ls etl/`.
LAYERS = [
    "errors", "columns", "kinds", "lazy", "arrow_values", "safe_paths", "ragged", "ui", "formats", "config", "ingest", "images", "tokens", "cache", "output", "packing",
    "pipeline", "mixture", "engine", "analysis", "loader", "train", "export", "sft", "commands", "cli", "__main__",
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every etl module a file imports (`from etl.x import y` counts y when it is a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "etl"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "etl":
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in imports_of(p) if m in files and m != name} for name, p in files.items()}


def family(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def test_no_module_imports_one_that_imports_it():
    edges = graph()
    reach: dict[str, set[str]] = {}

    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    for name in edges:
        reach[name] = reachable(name)
    cycles = sorted(n for n in edges if n in reach[n] and not n.endswith("__init__"))
    assert not cycles, f"modules that import themselves through others: {cycles}"


def test_families_import_only_the_ones_below():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = []
    for name, targets in graph().items():
        if name == "etl":
            continue
        for target in targets - {"etl"}:  # `from etl import __version__`
            src, dst = family(name), family(target)
            assert src in rank and dst in rank, f"{name} or {target}: add its family to LAYERS"
            if src != dst and rank[dst] > rank[src]:
                upward.append(f"{name} -> {target}")
    assert not upward, "imports that run up the layers:\n" + "\n".join(sorted(upward))


def test_top_level_shows_the_stage_families():
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert {"config", "ingest", "formats", "tokens", "pipeline", "output", "analysis", "ui",
            "loader", "train", "export", "commands", "packing", "mixture"} <= folders
    flat = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert flat == ["__init__", "__main__", "arrow_values", "cli", "columns", "errors", "kinds", "lazy", "ragged", "safe_paths", "sft"]
