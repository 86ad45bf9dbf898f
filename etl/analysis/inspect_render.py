"""How `etl inspect` shows tokens: `[[...]]` around trained runs in plain text, styled and shaded
spans in a terminal, marker lines where a turn (an example) or a piece (a pack) starts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

TRAIN_OPEN, TRAIN_CLOSE = "[[", "]]"
# Two shades per kind: neighbouring tokens alternate, so token boundaries show in the terminal.
# Named 256-colour shades: on 16-colour terminals they fall back to green / grey, not to one grey.
RICH_BG = {True: ("green4", "dark_green"), False: ("grey19", "grey30")}
RICH_FG = {True: "bold white", False: "grey70"}
SPECIAL_STYLE = "bold magenta"
TURN_STYLE = "bold cyan"


def plain_body(
    mask: Sequence[bool],
    strings: Sequence[str],
    markers: Mapping[int, Sequence[str]],
    *,
    token_sep: str = "",
) -> str:
    """The tokens as text, `[[...]]` around runs of trained ones, `markers[pos]` lines before
    the token at pos (turn starts of an example, piece starts of a pack)."""
    text: list[str] = []
    trained_run = False
    for pos, piece in enumerate(strings):
        trained = bool(mask[pos])
        if pos in markers or trained != trained_run:
            if trained_run:
                text.append(TRAIN_CLOSE)
            for line in markers.get(pos, ()):
                if text and not text[-1].endswith("\n"):
                    text.append("\n")
                text.append(line + "\n")
            if trained:
                text.append(TRAIN_OPEN)
            trained_run = trained
        elif pos:
            text.append(token_sep)
        text.append(printable(piece))
    if trained_run:
        text.append(TRAIN_CLOSE)
    return "".join(text).rstrip("\n") + "\n"


def rich_legend() -> Any:
    """The legend line of the rich view: one sample of each token style."""
    # rich: only for the coloured rendering, not --plain
    from rich.text import Text

    return Text.assemble(
        ("legend: ", "dim"),
        ("trained", _style_of(True, 0, special=False)),
        " ",
        ("not trained", _style_of(False, 0, special=False)),
        " ",
        ("special", _style_of(False, 0, special=True)),
    )


def rich_body(
    ids: Sequence[int],
    mask: Sequence[bool],
    strings: Sequence[str],
    markers: Mapping[int, Sequence[str]],
    *,
    special_ids: set[int],
) -> Any:
    """The tokens as a rich Text styled by mask, shaded by position, `markers[pos]` lines before
    the token at pos."""
    # rich: only for the coloured rendering, not --plain
    from rich.text import Text

    body = Text()
    for pos, (tid, piece) in enumerate(zip(ids, strings)):
        for line in markers.get(pos, ()):
            if body.plain and not body.plain.endswith("\n"):
                body.append("\n")
            body.append(line + "\n", style=TURN_STYLE)
        style = _style_of(bool(mask[pos]), pos, special=tid in special_ids)
        shown = printable(piece)
        # A newline token shows as a visible mark, then breaks the line as the text does.
        body.append(shown.replace("\n", "↵"), style=style)
        if "\n" in shown:
            body.append("\n")
    return body


def _style_of(trained: bool, pos: int, *, special: bool) -> str:
    """Rich style of a token: by trained or not, special or not, shaded by its position."""
    return f"{SPECIAL_STYLE if special else RICH_FG[trained]} on {RICH_BG[trained][pos % 2]}"


def printable(piece: str) -> str:
    """The token's text, control characters other than newline and tab shown as \\xNN (they
    would move the cursor or ring the bell)."""
    return "".join(c if c in "\n\t" or c.isprintable() else f"\\x{ord(c):02x}" for c in piece)
