"""Packed collate (issue 10, seed 003, DESIGN §6): a `PackedBatch` -> (B, T) arrays + document data.

Each row is its pieces back to back, then ``pad_id``, so a packed batch has the shapes of a padded
one (`etl.loader.collate`), plus what makes packed training equal unpacked training: per-token
``segment_ids``, ``position_ids`` that restart in every document, ``cu_seqlens`` for varlen
kernels and per-document trained counts. `etl.loader.attention` turns ``segment_ids`` into masks.

Pure numpy. The layout is one ``np.repeat`` of an item id per cell (an item is a piece or a row's
padding); every per-cell value is then a gather from a (P + B,) table, and the tokens are one
gather from the flat buffer. Cost ~20 passes over B x S cells, no loop per row, piece or token.
Packed batches are always fixed-shape (packing exists to fill T), so `PACKED_COLLATE_FNS` holds
one entry next to `COLLATE_FNS`' "fixed"/"longest" for padded batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from etl.columns import IGNORE_INDEX
from etl.errors import EtlError
from etl.ragged import PackedBatch

PackedTarget = Literal["y", "labels"]


class PackedCollateFn(Protocol):
    """Signature shared by every entry of `PACKED_COLLATE_FNS`."""

    def __call__(
        self,
        batch: PackedBatch,
        *,
        seq_len: int,
        pad_id: int,
        use_loss_mask: bool = True,
        mask_dtype: Any = np.bool_,
        ignore_index: int | None = IGNORE_INDEX,
        target: PackedTarget = "y",
        mask_boundary_loss: bool = True,
        train_on_eos: bool = True,
        eos_id: int | None = None,
    ) -> dict[str, np.ndarray]: ...


@dataclass(frozen=True)
class _Grid:
    """The (B, S) rows before the shift, the (B, T) document arrays over x, and the runs of x.

    Attributes:
        tokens: (B, S) ids in the data's dtype; padding cells hold garbage (see ``valid``).
        valid: (B, S) real token.
        ok: (B, S) the token may be a trained label: real, data mask, piece flag, eos rule.
        first: (B, S) the token starts a document (segment), for the boundary rule.
        weight: (B, S) float32 data weights (garbage on padding), or None.
        seg: (B, T) int32 segment ids over x; pos: (B, T) int64 position ids over x.
        runs: (R, 3) int64 (flat start in x, row, segment) of every run of x, in order.
    """

    tokens: np.ndarray
    valid: np.ndarray
    ok: np.ndarray
    first: np.ndarray
    weight: np.ndarray | None
    seg: np.ndarray
    pos: np.ndarray
    runs: np.ndarray


def _check(batch: PackedBatch, seq_len: int) -> np.ndarray:
    """Validate the batch's shape; return (B,) int64 tokens per row.

    Raises:
        EtlError: S < 2, no rows, rows unsorted or out of range, empty pieces, segments that
            are not 1, 2, ... in each row, or a row over S tokens: each a bug of the packer.
    """
    if seq_len < 2:
        raise EtlError(f"seq_len must be at least 2 (S = T + 1), got {seq_len}")
    row, seg, lengths = batch.row, batch.segment, batch.pieces.lengths
    step = np.diff(seg, prepend=0)
    new_row = np.diff(row, prepend=-1)
    bad = (new_row < 0) | (lengths < 1) | np.where(new_row > 0, seg != 1, (step < 0) | (step > 1))
    if batch.num_rows < 1 or np.any(bad) or (len(row) and not 0 <= row[-1] < batch.num_rows):
        raise EtlError(
            "malformed PackedBatch: it needs rows, pieces sorted by row and non-empty, "
            "segments numbered 1, 2, ... in each row; the packer that built it has a bug"
        )
    row_len = np.bincount(row, weights=lengths, minlength=batch.num_rows).astype(np.int64)
    if np.any(row_len > seq_len):
        raise EtlError(
            f"a packed row holds {int(row_len.max())} tokens, more than seq_len={seq_len}; "
            "the packer must use the same seq_len as the collate"
        )
    return row_len


def _take(flat: np.ndarray, src: np.ndarray) -> np.ndarray:
    """``flat[src]``; out-of-range cells (padding) read a clipped index and are never used."""
    if flat.size == 0:  # only when every row is padding
        return np.zeros(src.shape, dtype=flat.dtype)
    return np.take(flat, src, mode="clip")


def _items(batch: PackedBatch, row_len: np.ndarray, seq_len: int) -> dict[str, np.ndarray]:
    """Per-item tables in cell order: row 0's pieces, row 0's padding, row 1's pieces, ...

    Returns:
        Arrays of P + B items: ``len`` (cells of S; they sum to B x S), ``len_x`` (cells of x:
        a row's last non-empty item loses column S - 1), ``seg`` (0 on padding), ``base``
        (column where the item's segment, or the padding, starts), ``src`` (flat index of its
        first cell minus that cell's column), ``trained``, ``pad``, ``row``, ``col`` (first
        column) and ``run`` (a new segment, or padding, starts here).
    """
    num_rows, num = batch.num_rows, len(batch.row)
    row = batch.row.astype(np.int64, copy=False)
    lengths = batch.pieces.lengths.astype(np.int64, copy=False)
    segment = batch.segment.astype(np.int64, copy=False)
    col = (np.cumsum(lengths) - lengths) - (np.cumsum(row_len) - row_len)[row]
    new_seg = (np.diff(segment, prepend=0) != 0) | (np.diff(row, prepend=-1) != 0)
    seg_first = np.maximum.accumulate(np.where(new_seg, np.arange(num), 0))
    trained = np.ones(num, bool) if batch.trained is None else batch.trained.astype(bool)
    pads = np.arange(num_rows)
    # Interleave: piece j goes to slot j + row[j], row b's padding after its last piece.
    piece_slot = np.arange(num) + row
    pad_slot = np.cumsum(np.bincount(row, minlength=num_rows)) + pads
    columns = {
        "len": (lengths, seq_len - row_len),
        "seg": (segment.astype(np.int32), np.zeros(num_rows, np.int32)),
        "base": (col[seg_first].astype(np.int32), row_len.astype(np.int32)),
        "src": (batch.pieces.starts - col, -row_len),
        "trained": (trained, np.zeros(num_rows, bool)),
        "pad": (np.zeros(num, bool), np.ones(num_rows, bool)),
        "row": (row, pads),
        "col": (col, row_len),
        "run": (new_seg, np.ones(num_rows, bool)),
    }
    items = {}
    for name, (of_pieces, of_pads) in columns.items():  # 9 columns, not a loop over data
        items[name] = np.empty(num + num_rows, dtype=of_pieces.dtype)
        items[name][piece_slot], items[name][pad_slot] = of_pieces, of_pads
    items["len_x"] = items["len"].copy()
    items["len_x"][np.where(row_len < seq_len, pad_slot, pad_slot - 1)] -= 1
    return items


def _grid(
    batch: PackedBatch, *, seq_len: int, use_loss_mask: bool, eos_id: int | None
) -> _Grid:
    """Lay the pieces out in rows: (B, S) tokens and rules, (B, T) segments and positions.

    Each per-cell array is one ``np.repeat`` of an item table (10-30 us at B=32, S=2049): far
    cheaper than gathering through a cell -> item index. Large temporaries are few on purpose:
    a fresh 0.5 MB array costs its page faults (~0.3 ms on a VM whose freed heap is trimmed).
    """
    it = _items(batch, _check(batch, seq_len), seq_len)
    num_rows, width = batch.num_rows, seq_len - 1

    def cells(name: str, over_x: bool = False) -> np.ndarray:
        length = it["len_x"] if over_x else it["len"]
        return np.repeat(it[name], length).reshape(num_rows, width if over_x else seq_len)

    col = np.arange(seq_len, dtype=np.int64)
    src = cells("src")
    src += col  # padding cells point out of range: clipped by `_take`, masked by `valid`
    tokens = _take(batch.pieces.ids, src)
    ok = cells("trained")  # False on padding
    if use_loss_mask:
        mask = _take(batch.pieces.mask, src)  # type: ignore[arg-type]
        ok &= mask if mask.dtype == np.bool_ else mask != 0  # uint8 or float32 (seed 002)
    if eos_id is not None:
        ok &= tokens != eos_id
    starts = it["run"] & ~it["pad"]
    first = np.zeros((num_rows, seq_len), dtype=bool)
    first[it["row"][starts], it["col"][starts]] = True
    # Padding counts from 0 as a run of its own: positions stay small and inside the table of
    # learned-position models; padding is never trained, so the values do not reach the loss.
    pos = np.subtract(col[:-1], cells("base", over_x=True), dtype=np.int64)
    run = it["run"] & (it["col"] < width)  # runs that begin inside x
    weight = batch.pieces.weight
    return _Grid(
        tokens=tokens,
        valid=~cells("pad"),
        ok=ok,
        first=first,
        weight=None if weight is None else _take(weight, src).astype(np.float32, copy=False),
        seg=cells("seg", over_x=True),
        pos=pos,
        runs=np.stack([it["row"][run] * width + it["col"][run], it["row"][run], it["seg"][run]], 1),
    )


def _labels(
    g: _Grid, *, target: PackedTarget, mask_boundary_loss: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which labels are trained, their token columns, and the trained flags at x-positions.

    Returns:
        ``(trained (B, T), label columns slice, trained by x-position (B, T))``. For ``"y"``
        the label at i is token i + 1, predicted at x-position i; for ``"labels"`` it is token
        i, predicted at x-position i - 1 by the model's shift (column 0 is never a label).
    """
    ok, first = g.ok, g.first
    if target == "y":
        trained = ok[:, 1:] & ~first[:, 1:] if mask_boundary_loss else ok[:, 1:].copy()
        return trained, slice(1, None), trained
    if target != "labels":
        raise EtlError(f"target must be 'y' or 'labels', got {target!r}")
    trained = np.zeros(g.seg.shape, dtype=bool)
    trained[:, 1:] = ok[:, 1:-1] & ~first[:, 1:-1] if mask_boundary_loss else ok[:, 1:-1]
    at_x = np.zeros_like(trained)
    at_x[:, :-1] = trained[:, 1:]
    return trained, slice(None, -1), at_x


def _runs(g: _Grid, at_x: np.ndarray, num_seg: int) -> dict[str, np.ndarray]:
    """``cu_seqlens``, ``max_seqlen`` and ``segment_trained`` (B, num_seg) from the runs of x."""
    num_rows, width = g.seg.shape
    if num_rows * width >= 2**31:
        raise EtlError(f"B x T = {num_rows * width} overflows int32 cu_seqlens; use smaller B")
    bounds = np.append(g.runs[:, 0], num_rows * width)
    counts = np.add.reduceat(at_x.reshape(-1).view(np.uint8), g.runs[:, 0], dtype=np.int32)
    per_seg = np.zeros((num_rows, max(num_seg, 1) + 1), dtype=np.int32)
    per_seg[g.runs[:, 1], g.runs[:, 2]] = counts  # column 0: padding runs, never trained
    return {
        "cu_seqlens": bounds.astype(np.int32),
        "max_seqlen": np.array(np.diff(bounds).max(), dtype=np.int32),
        "segment_trained": np.ascontiguousarray(per_seg[:, 1:]),
    }


def collate_packed(
    batch: PackedBatch,
    *,
    seq_len: int,
    pad_id: int,
    use_loss_mask: bool = True,
    mask_dtype: Any = np.bool_,
    ignore_index: int | None = IGNORE_INDEX,
    target: PackedTarget = "y",
    mask_boundary_loss: bool = True,
    train_on_eos: bool = True,
    eos_id: int | None = None,
) -> dict[str, np.ndarray]:
    """Packed rows of S = seq_len tokens -> (B, T) arrays, T = S - 1, as a padded batch has.

    Trade-off: fixed shapes and ~no padding, but the model must honour ``segment_ids`` (document
    mask, `etl.loader.attention`) and ``position_ids`` to train as if unpacked; without them it
    is seed 003's stream semantics (attention leaks across documents, only the loss is masked).

    A label is trained iff its token is real, its data mask is on (``use_loss_mask``), its
    piece's ``trained`` flag is set, it is not the first token of a document
    (``mask_boundary_loss``: nothing predicts the next document's first token) and, with
    ``train_on_eos=False``, it is not ``eos_id``.

    Args:
        batch: B rows of pieces (at most S tokens per row).
        seq_len: S = T + 1 tokens per row before the shift.
        pad_id: id after a row's last piece (segment 0, never trained).
        use_loss_mask: False trains every real token (padding still never).
        mask_dtype: dtype of ``loss_mask``: bool (seed 000) or np.float32 (seed 002).
        ignore_index: label value where not trained; None keeps the raw ids.
        target: ``"y"`` (seed 000: ``x`` = t[:-1], ``y`` = t[1:]) or ``"labels"`` (seed 003:
            ``input_ids`` = ``labels`` = t[:-1], the model shifts; token S - 1 of a full row is
            then never predicted, so pack with one spare token to lose nothing).
        mask_boundary_loss: seed 003's knob (default on).
        train_on_eos: seed 003's knob; False sets every label equal to ``eos_id`` to ignored.
        eos_id: the eos token id; required when ``train_on_eos`` is False.

    Returns:
        ``x``/``input_ids`` and ``y``/``labels`` (B, T) int64; ``loss_mask`` (B, T) aligned to
        the labels; ``attention_mask`` (B, T) bool (real tokens); ``segment_ids`` (B, T) int32
        (1..k per row, 0 on padding); ``position_ids`` (B, T) int64 (0 at each segment start,
        padding counts from 0 too); ``cu_seqlens`` (R + 1,) int32 boundaries of the runs of
        equal (row, segment) over the flattened x, padding runs included so that
        ``cu_seqlens[-1] == B * T`` (flash-attn varlen style: each run attends only to itself);
        ``max_seqlen`` 0-d int32; ``segment_trained`` (B, K) int32 trained labels whose
        x-position is in segment k + 1 (K = largest segment, >= 1), for per-example weights
        ``1 / segment_trained.gather(1, (segment_ids - 1).clamp(min=0)).clamp(min=1)``;
        ``loss_weight`` (B, T) float32 at the label's token (0 where untrained) when the
        data has weights.

    Raises:
        EtlError: a row over S tokens or a malformed batch, no loss mask while
            ``use_loss_mask``, or ``train_on_eos=False`` without ``eos_id``.
    """
    if use_loss_mask and batch.pieces.mask is None:
        raise EtlError("the data has no loss mask; pass use_loss_mask=False to train on every token")
    if not train_on_eos and eos_id is None:
        raise EtlError("train_on_eos=False needs eos_id=<the tokenizer's eos token id>")
    g = _grid(
        batch, seq_len=seq_len, use_loss_mask=use_loss_mask, eos_id=None if train_on_eos else eos_id
    )
    trained, cols, at_x = _labels(g, target=target, mask_boundary_loss=mask_boundary_loss)
    if ignore_index is None:  # raw ids: only padding is replaced
        labels = _fill(g.tokens[:, cols], g.valid[:, cols], pad_id)
    else:
        labels = _fill(g.tokens[:, cols], trained, ignore_index)
    x_name, label_name = ("x", "y") if target == "y" else ("input_ids", "labels")
    out = {
        x_name: _fill(g.tokens[:, :-1], g.valid[:, :-1], pad_id),
        label_name: labels,
        "loss_mask": trained.astype(mask_dtype, copy=False),
        "attention_mask": np.ascontiguousarray(g.valid[:, :-1]),
        "segment_ids": g.seg,
        "position_ids": g.pos,
        **_runs(g, at_x, int(batch.segment.max(initial=0))),
    }
    if g.weight is not None:  # weights are finite, so 0 x (padding garbage) is 0
        out["loss_weight"] = np.multiply(g.weight[:, cols], trained, dtype=np.float32)
    return out


def _fill(values: np.ndarray, keep: np.ndarray, fill: int) -> np.ndarray:
    """int64 ``where(keep, values, fill)``, branch-free: np.where costs ~6x more (0.3 ms at
    B=32, T=2048) on a random-looking mask, the arithmetic ~3 passes whatever the mask."""
    out = np.subtract(values, fill, dtype=np.int64)
    out *= keep
    out += fill
    return out


PACKED_COLLATE_FNS: dict[str, PackedCollateFn] = {"packed": collate_packed}
