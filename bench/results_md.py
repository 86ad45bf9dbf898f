"""The markdown side of `bench/results.py`: tables, number formats, machine facts, timings lines.

Pure functions over strings and numbers (no measurement here), so tests can check them on rows.
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("polars", "pyarrow", "tokenizers", "torch", "ray", "numpy", "duckdb", "transformers", "datasets", "trl")


@dataclass
class Table:
    """One section of results.md: a title, a table, and notes under it (each a paragraph)."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def cell(value: object) -> str:
    """A table cell: `|` escaped, newlines folded (commands and messages may hold either)."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def table_lines(columns: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A markdown table; the first column left-aligned, the others right-aligned except commands."""
    align = ["---" if i == 0 or c.lower().startswith("command") else "---:" for i, c in enumerate(columns)]
    lines = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines


def render(title: str, header: Sequence[str], tables: Sequence[Table]) -> str:
    """The whole file: `# title`, header paragraphs, then `## n. section` per table."""
    out = [f"# {title}", "", *[p for line in header for p in (line, "")]]
    for n, table in enumerate(tables, 1):
        out += [f"## {n}. {table.title}", ""]
        if table.rows:
            out += [*table_lines(table.columns, table.rows), ""]
        out += [p for note in table.notes for p in (note, "")]
    return "\n".join(out).rstrip() + "\n"


def secs(values: Sequence[float], digits: int = 2) -> str:
    """The median, with the range when there were several runs: `5.41 (5.30-5.62)`."""
    med = statistics.median(values)
    return f"{med:.{digits}f}" if len(values) == 1 else f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def rate(tokens: float, seconds: float) -> str:
    """Millions of tokens per second."""
    return f"{tokens / seconds / 1e6:.2f}M"


def ratio(x: float) -> str:
    """`2.50×`; under 0.1 two significant digits (`0.0031×`: a bare gigatoken call beside a whole run)."""
    return f"{x:.2f}×" if x >= 0.1 else f"{x:.2g}×"


def parse_timings(text: str) -> dict[str, float]:
    """The `etl run timings: total 4.20s, parse 0.46s, ...` line of `--timings` as {stage: seconds}."""
    match = re.search(r"etl run timings:(.*)", text)
    if not match:
        return {}
    return {k: float(v) for k, v in re.findall(r"([A-Za-z_][\w.]*)\s+([0-9.]+)s", match.group(1))}


def from_results(title: str, value: Any) -> Table:
    """A table from another bench module's `results()`: markdown text, a list of dicts,
    `(columns, rows)`, or a `Table`; anything else is shown as its repr."""
    if isinstance(value, Table):
        return value
    if isinstance(value, str):
        return Table(title, [], notes=[value.strip()])
    if isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
        columns = list(dict.fromkeys(k for r in value for k in r))
        return Table(title, columns, [[r.get(c, "") for c in columns] for r in value])
    if isinstance(value, tuple) and len(value) == 2:
        return Table(title, [str(c) for c in value[0]], [list(r) for r in value[1]])
    return Table(title, [], notes=[f"`{value!r}`"])


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    found = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return found.group(1).strip() if found else platform.processor() or "unknown"


def memory_gib() -> str:
    try:
        kib = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))  # type: ignore[union-attr]
    except (OSError, AttributeError):
        return "unknown"
    return f"{kib / (1 << 20):.1f} GiB"


def versions(packages: Iterable[str] = PACKAGES) -> str:
    """`name version` of each package, `name absent` when not installed (read, never imported)."""
    found = []
    for name in packages:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} absent")
    return ", ".join(found)


def machine_facts(repo: Path) -> list[str]:
    """Header lines: cores, CPU, memory, Python, package versions, the commit measured."""
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, check=False).stdout.strip()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [
        (f"Machine: {cores} cores usable ({os.cpu_count()} online), {cpu_model()}, {memory_gib()} RAM, "
        f"{platform.system()} {platform.release()}; Python {platform.python_version()}."),
        f"Versions: {versions()}.",
        f"etl: commit {commit or 'unknown'}{' (with uncommitted changes)' if dirty else ''}.",
    ]
