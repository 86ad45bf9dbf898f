"""`etl inspect DST --pack N`: packed row N of the pack index as text, a marker line per piece.

Reads the split's pack index (`read_pack_index`, checked against the data it was built from) and
only the row groups of `DST/data/<split>` that hold the pack's examples. A token is shown as
trained where the data's `loss_mask` and the piece's `trained` flag (the stream packer masks
whole pieces) are both true: what a packed batch trains.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from etl import columns as C
from etl.analysis.inspect_render import TRAIN_CLOSE, TRAIN_OPEN, plain_body, rich_body, rich_legend
from etl.errors import EtlError
from etl.output.parts import listed_parts, open_part
from etl.packing.index_io import read_pack_index

DATA_COLUMNS = [C.ID, C.INPUT_IDS, C.LOSS_MASK]


def read_pack(dst: str | os.PathLike[str], *, split: str = "train", pack: int) -> dict[str, Any]:
    """Pack `pack` of the split's index: its pieces and the tokens and mask they fill it with.

    Returns:
        ``split``, ``pack``, ``num_packs``, ``strategy``, ``seq_len``, ``pieces`` (one dict per
        piece: ``id``, ``row``, ``offset``, ``length``, ``trained``, ``segment``,
        ``example_tokens``), ``input_ids`` and ``loss_mask`` (the packed row, unpadded).

    Raises:
        EtlError: DST has no index for the split, the pack is out of range, or the index no
            longer matches the data.
    """
    index = read_pack_index(dst, split)
    if index is None:
        raise EtlError(f"{dst} has no pack index for split {split!r}; write one with "
                       f"`etl pack {dst} --strategy bfd` (or pick --split)")
    p = index.packing
    if not 0 <= pack < p.num_packs:
        raise EtlError(f"pack {pack} is out of range: split {split!r} has {p.num_packs:,} packs "
                       f"(use --pack 0..{max(p.num_packs - 1, 0)})")
    lo, hi = (int(b) for b in p.pack_starts()[pack : pack + 2])
    segments = p.segments()[lo:hi]
    trained = np.ones(hi - lo, dtype=bool) if p.trained is None else p.trained[lo:hi]
    examples = _read_rows(dst, split, sorted({int(d) for d in p.doc[lo:hi]}))
    pieces, ids, mask = [], [], []
    for j in range(lo, hi):  # one pack: a handful of pieces, read once for a human
        row, start, length = int(p.doc[j]), int(p.start[j]), int(p.length[j])
        example = examples[row]
        assert index.ids is None or example[C.ID] == index.ids[j], "index ids disagree with the data"
        ids += example[C.INPUT_IDS][start : start + length]
        mask += [bool(m) and bool(trained[j - lo]) for m in example[C.LOSS_MASK][start : start + length]]
        pieces.append({"id": example[C.ID], "row": row, "offset": start, "length": length,
                       "trained": bool(trained[j - lo]), "segment": int(segments[j - lo]),
                       "example_tokens": len(example[C.INPUT_IDS])})
    return {"split": split, "pack": pack, "num_packs": p.num_packs, "strategy": index.strategy,
            "seq_len": index.seq_len, "pieces": pieces, C.INPUT_IDS: ids, C.LOSS_MASK: mask}


def _read_rows(dst: str | os.PathLike[str], split: str, rows: Sequence[int]) -> dict[int, dict[str, Any]]:
    """Global rows of the split (numbered over its listed parts), reading only their row groups."""
    files = [open_part(p) for p in listed_parts(dst, f"{C.DATA_DIR}/{split}", checksum=True)]
    groups = [(f, g) for f, pf in enumerate(files) for g in range(pf.metadata.num_row_groups)]
    sizes = [files[f].metadata.row_group(g).num_rows for f, g in groups]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    out: dict[int, dict[str, Any]] = {}
    read: dict[int, Any] = {}  # a pack's examples often share a row group: read it once
    for row in rows:
        k = int(np.searchsorted(starts, row, side="right")) - 1
        if k not in read:
            f, g = groups[k]
            read[k] = files[f].read_row_group(g, columns=DATA_COLUMNS)
        out[row] = read[k].slice(row - int(starts[k]), 1).to_pylist()[0]
    return out


def _describe_pack(pack: dict[str, Any]) -> list[str]:
    """Header lines: which pack, its fill and what it holds."""
    n, s = len(pack[C.INPUT_IDS]), pack["seq_len"]
    examples = len({piece["row"] for piece in pack["pieces"]})
    where = f"pack {pack['pack']} of {pack['num_packs']:,} in {pack['split']}"
    fill = f"tokens {n} ({n / s:.4f} of seq_len, {s - n} padding)"
    held = f"pieces {len(pack['pieces'])} · examples {examples}"
    return [f"{where} · strategy {pack['strategy']} · seq_len {s}",
            f"{fill} · trained {sum(pack[C.LOSS_MASK])} · {held}"]


def _piece_marker(piece: dict[str, Any]) -> str:
    """The line printed where a piece starts."""
    start, end = piece["offset"], piece["offset"] + piece["length"]
    masked = "" if piece["trained"] else " · masked by the packer"
    return (f"── segment {piece['segment']} · id {piece['id']} · row {piece['row']} · tokens "
            f"[{start}, {end}) of {piece['example_tokens']}{masked} ──")


def _markers(pack: dict[str, Any]) -> dict[int, list[str]]:
    at = np.cumsum([0] + [piece["length"] for piece in pack["pieces"]])
    return {int(pos): [_piece_marker(piece)] for pos, piece in zip(at, pack["pieces"])}


def render_pack_plain(pack: dict[str, Any], strings: Sequence[str], *, token_sep: str = "") -> str:
    """Plain text: a marker line per piece, `[[...]]` around runs of trained tokens."""
    out = [*_describe_pack(pack), f"legend: {TRAIN_OPEN}trained tokens{TRAIN_CLOSE}", ""]
    return "\n".join(out) + "\n" + plain_body(pack[C.LOSS_MASK], strings, _markers(pack), token_sep=token_sep)


def render_pack_rich(pack: dict[str, Any], strings: Sequence[str], *, special_ids: set[int]) -> list[Any]:
    """Rich renderables: header, legend, then the packed tokens with a marker line per piece."""
    # rich: only for the coloured rendering, not --plain
    from rich.text import Text

    body = rich_body(pack[C.INPUT_IDS], pack[C.LOSS_MASK], strings, _markers(pack), special_ids=special_ids)
    return [Text("\n".join(_describe_pack(pack)), style="bold"), rich_legend(), Text(""), body]
