"""Every ```bash and ```python block of README.md, then of every docs page, runs as written.

README.md comes first, then the pages of docs/ in the order of mkdocs.yml's `nav`, each page's
blocks in document order.

The blocks run in a copy of the repository (what git ignores left out, as in a fresh clone)
next to a link to ../shared, so nothing is written into the checkout. `.venv` in the copy links
to the environment running the tests. Later blocks use what earlier ones wrote (`make etl`'s
parquet/), so one test runs them all and names the block and command that failed.

Make lines run with the venv's stamp held old (`make -o .venv/.installed`): the recipe runs as
written, but the venv is never rebuilt (pip would re-point the shared editable install at the
copy). `make` targets in MAKE_SKIP are not run, for the reason given. A command that reads
../shared is skipped with the rest of its block (later commands use its output) when
../shared is absent; a python block that names ../shared is skipped whole.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
STAMP = ".venv/.installed"  # the Makefile's STAMP: its rule creates the venv and pip-installs
MAKE_SKIP = {
    "test": "it runs the suite this test belongs to",
    "bench": "minutes of benchmarks; `make bench` is run on its own",
    "clean": "it deletes .venv, here a link to the environment running the tests",
}
BLOCK = re.compile(r"^```(bash|python)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
# README snippets call a `model`: a stand-in that checks the batch it is given.
PYTHON_PRELUDE = '''\
def model(x, y):
    assert x.shape == y.shape and x.ndim == 2, (x.shape, y.shape)
    return 0.0
'''
TIMEOUT_S = 120


NAV_PAGE = re.compile(r"^\s*-\s*(?:[^:\n]+:\s*)?([\w./-]+\.md)\s*$", re.MULTILINE)


def documents() -> list[str]:
    """README.md, then the docs pages as mkdocs.yml's nav lists them (read without a YAML parser)."""
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:", 1)[1]
    return ["README.md"] + [f"docs/{page}" for page in NAV_PAGE.findall(nav)]


def blocks(document: str) -> list[tuple[int, str, str]]:
    """(line number, language, code) of every ```bash / ```python block of one file, in order."""
    text = (REPO / document).read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)) for m in BLOCK.finditer(text)]


def readme_blocks() -> list[tuple[int, str, str]]:
    """The blocks of README.md alone."""
    return blocks("README.md")


def commands(code: str) -> list[str]:
    """Shell commands of a bash block: continuation lines joined, blank and comment lines out."""
    joined = re.sub(r"\\\n", " ", code)
    return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def prepare(command: str) -> tuple[str | None, str]:
    """(the command to run or None to skip it, why); `stop` in `why` ends the block."""
    words = command.split()
    if words[0] == "make":
        target = next((w for w in words[1:] if not w.startswith("-") and "=" not in w), "")
        if target in MAKE_SKIP:
            return None, MAKE_SKIP[target]
        if shutil.which("make") is None:
            return None, "no make on this machine"
        return f"make -o {STAMP} {' '.join(words[1:])}", ""
    if "../shared" in command and not SHARED.is_dir():
        return None, "stop: needs ../shared"
    return command, ""


def copy_checkout(dest: Path) -> Path:
    """The checkout without what .gitignore names (and .git): what a fresh clone has."""
    patterns = [".git"] + [
        line.strip().strip("/")
        for line in (REPO / ".gitignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def ignore(_folder: str, names: list[str]) -> set[str]:
        return {n for n in names if any(fnmatch.fnmatch(n, p) for p in patterns)}

    repo = dest / "repo"
    shutil.copytree(REPO, repo, ignore=ignore, symlinks=True)
    (repo / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    if SHARED.is_dir():
        (dest / "shared").symlink_to(SHARED, target_is_directory=True)
    return repo


def run_bash(code: str, repo: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    lines, skipped = ["set -eo pipefail", "trap 'echo \"failed: $BASH_COMMAND\" >&2' ERR"], []
    for command in commands(code):
        ready, why = prepare(command)
        if ready is None:
            skipped.append(f"{command} ({why})")
            if why.startswith("stop"):
                break
            continue
        lines.append(ready)
    proc = subprocess.run(["bash", "-c", "\n".join(lines)], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S, check=False)
    return proc, skipped


def run_python(code: str, repo: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PYTHON_PRELUDE + code], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def test_every_docs_page_is_in_the_nav() -> None:
    pages = documents()[1:]
    assert len(pages) == len(set(pages)) and all((REPO / page).is_file() for page in pages), pages
    assert sorted(pages) == sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))


def test_readme_blocks_are_found() -> None:
    kinds = [kind for _, kind, _ in readme_blocks()]
    assert "bash" in kinds and "python" in kinds
    assert any(c.startswith("make etl") for _, kind, code in readme_blocks() if kind == "bash"
               for c in commands(code))


def test_every_readme_command_runs_as_written(tmp_path: Path) -> None:
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    repo = copy_checkout(tmp_path)
    # The copy's etl is imported (not the editable install's path), and no outside setting leaks in.
    env = {**os.environ, "PYTHONPATH": str(repo), "NO_COLOR": "1"}
    env.pop("VIRTUAL_ENV", None)
    for document in documents():
        for line, kind, code in blocks(document):
            where = f"{document} line {line}"
            if kind == "bash":
                proc, skipped = run_bash(code, repo, env)
                for command in skipped:  # shown with the output of a failing or -rP run
                    print(f"{where}: skipped {command}")
            elif "../shared" in code and not SHARED.is_dir():
                print(f"{where}: skipped the python block (needs ../shared)")
                continue
            else:
                proc = run_python(code, repo, env)
            assert proc.returncode == 0, (
                f"{where} ({kind} block) failed with exit status {proc.returncode}:\n"
                f"{code}\n--- stderr ---\n{proc.stderr[-3000:]}\n--- stdout ---\n{proc.stdout[-2000:]}"
            )
