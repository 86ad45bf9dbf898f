"""Walk a folder of SRC, following symlinked folders but entering each real folder once.

`os.walk(followlinks=True)` alone went round a symlink loop (`sub/up -> ..`) until the path grew
too long (every file read 41 times) and, with two loops, for ever. Here a folder is known by its
(st_dev, st_ino): a link to a folder that holds it is a loop, a second path to a folder already
entered is not entered again, and both come back as `Skipped` so that the run counts them.
One `os.stat` per folder is all it adds.
"""

from __future__ import annotations

import fnmatch
import glob
import os
from dataclasses import dataclass
from pathlib import Path

UNREADABLE_DIR = "unreadable_dir"
SYMLINK_LOOP = "symlink_loop"
ALREADY_READ = "already_read"


@dataclass(frozen=True)
class Skipped:
    """A path under SRC that is not read, the reject reason it is counted under, and why."""

    path: Path
    reason: str
    why: str
    folder: bool = True


def hidden(part: str) -> bool:
    """A hidden or underscore-prefixed name (`.ipynb_checkpoints`, `_old`): not input."""
    return part.startswith((".", "_")) and part not in (".", "..")


def identity(st: os.stat_result) -> tuple[int, int]:
    """What makes two paths the same file or folder (a symlink, a hard link, a bind mount)."""
    return st.st_dev, st.st_ino


def walk(root: Path) -> tuple[list[Path], list[Skipped]]:
    """Everything under root that is not a folder (files, links to files, dangling links, FIFOs:
    the caller tells them apart), and the folders not entered. Hidden and underscore-prefixed
    folders are not entered (nor counted); a folder root cannot list is `unreadable_dir`."""
    entries: list[Path] = []
    skipped: list[Skipped] = []

    def failed(exc: OSError) -> None:
        skipped.append(Skipped(Path(exc.filename or root), UNREADABLE_DIR, exc.strerror or str(exc)))

    try:
        walked = {str(root): identity(os.stat(root))}  # folder entered -> its identity
    except OSError as exc:
        return [], [Skipped(root, UNREADABLE_DIR, exc.strerror or str(exc))]
    first = {ident: path for path, ident in walked.items()}  # identity -> the path it is entered by
    for folder, dirs, names in os.walk(root, onerror=failed, followlinks=True):
        entries += [Path(folder) / n for n in names]
        dirs[:] = _enter(folder, sorted(d for d in dirs if not hidden(d)), walked, first, skipped)
    return entries, skipped


def _enter(folder: str, dirs: list[str], walked: dict[str, tuple[int, int]], first: dict[tuple[int, int], str],
           skipped: list[Skipped]) -> list[str]:
    """The subfolders of `folder` to walk: those whose real folder is not entered by another path.

    All of them are claimed before any is walked, so a folder's own path wins over a link to it
    from an earlier sibling; `os.walk` then goes depth first in name order, so which path
    reaches a folder first is the same on every run.
    """
    above, path, parent = set(), folder, None
    while path in walked and path != parent:  # folder and its parents up to root (`/` is its own)
        above.add(walked[path])
        path, parent = os.path.dirname(path), path
    keep = []
    for d in dirs:
        sub = os.path.join(folder, d)
        try:
            ident = identity(os.stat(sub))
        except OSError as exc:  # gone or unreachable since os.walk listed it
            skipped.append(Skipped(Path(sub), UNREADABLE_DIR, exc.strerror or str(exc)))
            continue
        target = os.path.realpath(sub)
        if ident in above:
            skipped.append(Skipped(Path(sub), SYMLINK_LOOP, f"a link to {target}, a folder that holds it (a loop)"))
        elif ident in first:
            skipped.append(Skipped(Path(sub), ALREADY_READ, f"a link to {target}, already read as {first[ident]}"))
        else:
            first[ident] = sub
            walked[sub] = ident
            keep.append(d)
    return keep


def walk_glob(pattern: str) -> tuple[list[Path], list[Skipped]]:
    """What a glob matches (files and other non-folders), and the folders its `**` did not enter.

    Up to the first `**` part, `glob` (its depth is bounded by the pattern's); from there, `walk`:
    `glob`'s own `**` follows links into loops too (two loops: it never ended).
    """
    parts = Path(pattern).parts
    if "**" not in parts:
        return [Path(p) for p in glob.glob(pattern)], []
    cut = parts.index("**")
    heads = sorted(glob.glob(str(Path(*parts[:cut])))) if cut else ["."]
    found: list[Path] = []
    skipped: list[Skipped] = []
    for head in heads:
        if os.path.isdir(head):
            entries, skips = walk(Path(head))
            found += [p for p in entries if _matches(p.relative_to(head).parts, parts[cut:])]
            skipped += skips
    return found, skipped


def _matches(parts: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    """`glob`'s rule for a path below its folder: `**` stands for any number of folders (none
    too), any other part for one name (`fnmatch`). Per file, not per record."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_matches(parts[i:], pattern[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _matches(parts[1:], pattern[1:])
