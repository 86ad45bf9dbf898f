"""Writes and deletes below a folder etl owns (DST, OUT, the token cache) never go through a symlink.

A link planted below DST (`data/train -> ~/out`, `_lock -> ~/.bashrc`) would make a rerun delete,
truncate or overwrite a file outside DST. So every writer checks the path from its root down before
it creates, renames or deletes it (one `lstat` per component: docs/design.md, Measured costs), and
the files etl opens
itself are opened with `O_NOFOLLOW`. The root itself may be a link: where DST lives is the user's
choice, and only what lies below it is etl's.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from etl.errors import EtlError


class SymlinkRefused(EtlError):
    """A path etl was about to write or delete goes through a symlink below its root."""


def _refuse(link: Path, root: Path) -> SymlinkRefused:
    try:
        target = os.readlink(link)
    except OSError:
        target = "?"
    return SymlinkRefused(
        f"refusing to write through the symlink {link} (-> {target}): etl writes and deletes only "
        f"real files and folders below {root}; remove the link and rerun"
    )


def check_no_symlink(path: Path, root: Path) -> Path:
    """`path`, once no component of it below `root` (itself included) is a symlink.

    Components that do not exist yet are fine: etl creates them as real folders and files.

    Raises:
        SymlinkRefused: naming the first link found.
    """
    # Split and joined as strings: a pathlib join or `relative_to` costs several lstats, so strings
    # check a part's path many times faster (docs/design.md, Measured costs).
    base, full = os.fspath(root).rstrip(os.sep), os.fspath(path)
    if full == base:
        parts: Sequence[str] = ()
    elif full.startswith(base + os.sep):
        parts = full[len(base) + 1:].split(os.sep)
    else:  # a root like "." (or a path not below it: ValueError)
        parts = path.relative_to(root).parts
    current = base
    for part in parts:
        current += os.sep + part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return path  # nothing below a missing component exists either
        if stat.S_ISLNK(mode):
            raise _refuse(Path(current), root)
    return path


def open_nofollow(path: Path, flags: int, root: Path, mode: int = 0o644) -> int:
    """`os.open(path, flags | O_NOFOLLOW)` after `check_no_symlink`: a file descriptor.

    The check covers the folders above; `O_NOFOLLOW` the file itself, with no window between the
    check and the open.
    """
    check_no_symlink(path.parent, root)
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(path, root) from None
        raise
