"""How `etl inspect` shows tokens: `[[...]]` around trained runs in plain text, styled and shaded
spans in a terminal, marker lines where a turn (an example) or a piece (a pack) starts, one label
in place of each image's tokens (`image_spans`, `collapse_images`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

TRAIN_OPEN, TRAIN_CLOSE = "[[", "]]"
# Two shades per kind: neighbouring tokens alternate, so token boundaries show in the terminal.
# Named 256-colour shades: on 16-colour terminals they fall back to green / grey, not to one grey.
RICH_BG = {True: ("green4", "dark_green"), False: ("grey19", "grey30")}
RICH_FG = {True: "bold white", False: "grey70"}
SPECIAL_STYLE = "bold magenta"
TURN_STYLE = "bold cyan"
IMAGE_STYLE = "bold black on yellow"  # an image's span, shown as one label (`image_label`)


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


def rich_legend(*, images: bool = False) -> Any:
    """The legend line of the rich view: one sample of each token style (`images`: of an image's
    label too)."""
    # rich: only for the coloured rendering, not --plain
    from rich.text import Text

    return Text.assemble(
        ("legend: ", "dim"),
        ("trained", _style_of(True, 0, special=False)),
        " ",
        ("not trained", _style_of(False, 0, special=False)),
        " ",
        ("special", _style_of(False, 0, special=True)),
        *([" ", ("image", IMAGE_STYLE)] if images else []),
    )


def rich_body(
    ids: Sequence[int],
    mask: Sequence[bool],
    strings: Sequence[str],
    markers: Mapping[int, Sequence[str]],
    *,
    special_ids: set[int],
    image_at: Collection[int] = (),
) -> Any:
    """The tokens as a rich Text styled by mask, shaded by position, `markers[pos]` lines before
    the token at pos; the positions `image_at` hold images' labels (`collapse_spans`)."""
    # rich: only for the coloured rendering, not --plain
    from rich.text import Text

    body = Text()
    for pos, (tid, piece) in enumerate(zip(ids, strings)):
        for line in markers.get(pos, ()):
            if body.plain and not body.plain.endswith("\n"):
                body.append("\n")
            body.append(line + "\n", style=TURN_STYLE)
        special = tid in special_ids
        style = IMAGE_STYLE if pos in image_at else _style_of(bool(mask[pos]), pos, special=special)
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


def image_spans(ids: Sequence[int], span_ids: Sequence[int]) -> Any:
    """The first and last position of each image's span (start, pads only, end) in `ids`, one row
    per image in order: an (n, 2) int array, found with numpy, not a loop over the tokens."""
    # numpy: only where an example's image spans are looked for
    import numpy as np

    start, pad, end = span_ids
    tokens = np.asarray(ids)
    starts, ends = np.flatnonzero(tokens == start), np.flatnonzero(tokens == end)
    after = np.searchsorted(ends, starts)  # the first end after each start
    closed = after < ends.size
    starts, stops = starts[closed], ends[after[closed]]
    pads = np.concatenate([[0], np.cumsum(tokens == pad)])
    whole = pads[stops] - pads[starts + 1] == stops - starts - 1  # nothing but pads between
    return np.stack([starts[whole], stops[whole]], axis=1)


def image_label(index: int, size: Sequence[int] | None, grid: Sequence[int] | None, pads: int) -> str:
    """What stands for an image's span: `<image 1: 640x427 -> grid 1x30x46, 345 tokens>` (its
    1-based index in the example, [width, height], [t, h, w] grid, pad tokens); `?` for a size or
    grid the row lacks."""
    shown = "x".join(map(str, size)) if size else "?"
    return f"<image {index}: {shown} -> grid {'x'.join(map(str, grid)) if grid else '?'}, {pads} tokens>"


def collapse_images(
    ids: Sequence[int],
    mask: Sequence[bool],
    strings: Sequence[str],
    markers: Mapping[int, Sequence[str]],
    images: tuple[Sequence[int], Sequence[Sequence[int]], Sequence[Sequence[int]]],
) -> tuple[Sequence[int], Sequence[bool], Sequence[str], Mapping[int, Sequence[str]], set[int]]:
    """The tokens with each image's span one token, its `image_label` as its string (the span's
    first id and mask: an image's tokens never train), markers moved to the positions left, and
    the labels' positions. `images`: the span's [start, pad, end] ids, the example's [width,
    height] and [t, h, w] per image. An example with no span comes back as it is, uncopied."""
    # numpy: only where an example's image spans are looked for
    import numpy as np

    span_ids, sizes, grids = images
    spans = image_spans(ids, span_ids)
    if not len(spans):
        return ids, mask, strings, markers, set()
    n, lengths = len(ids), spans[:, 1] - spans[:, 0]
    inside = np.zeros(n + 1, dtype=np.int64)  # +1 after a span's first token, -1 after its last
    np.add.at(inside, spans[:, 0] + 1, 1)
    np.add.at(inside, spans[:, 1] + 1, -1)
    keep = np.cumsum(inside[:n]) == 0
    shown = np.asarray(strings, dtype=object)
    shown[spans[:, 0]] = [
        image_label(k + 1, sizes[k] if k < len(sizes) else None, grids[k] if k < len(grids) else None,
                    int(length - 1)) for k, length in enumerate(lengths)]
    gone = np.concatenate([[0], np.cumsum(~keep)])  # tokens taken out before each position
    labels = spans[:, 0] - gone[spans[:, 0]]
    return (np.asarray(ids)[keep].tolist(), np.asarray(mask, dtype=bool)[keep].tolist(),
            shown[keep].tolist(), {pos - int(gone[min(pos, n)]): lines for pos, lines in markers.items()},
            set(labels.tolist()))
