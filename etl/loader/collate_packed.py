"""Packed collate: a `PackedBatch` -> (B, T) arrays + documents.

Each row is its pieces back to back, then ``pad_id``: the shapes of a padded batch
(`etl.loader.collate`), plus what makes packed training equal unpacked training: ``segment_ids``,
``position_ids`` that restart in every document, ``cu_seqlens`` for varlen kernels and trained
counts per document. `etl.loader.attention` turns ``segment_ids`` into attention masks.

Pure numpy, no loop per row, piece or token: a (P + B)-item table (pieces and each row's
padding, in cell order) is expanded with one ``np.repeat`` per per-cell array, and the tokens are
one gather from the flat buffer. Packed rows are fixed-shape by nature (packing exists to fill
T), so `PACKED_COLLATE_FNS` has one entry; it sits next to `COLLATE_FNS` for padded batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from etl.columns import IGNORE_INDEX, check_seq_len
from etl.errors import EtlBug, EtlError
from etl.ragged import PackedBatch

PackedTarget = Literal["y", "labels"]


# The signature of `collate_packed`; one entry today (packed rows are fixed-shape by nature).
PackedCollateFn = Callable[..., dict[str, np.ndarray]]


@dataclass(frozen=True)
class _Grid:
    """(B, S) ``tokens`` (data dtype, garbage on padding), ``valid``, ``ok`` (may be a trained
    label: every rule but the target's), ``weight`` (float32 or None); (B, T) ``seg`` and ``pos``
    over x (T = S - 1 for target ``y``, S for ``labels``); ``runs`` (3, R) flat start in x, row
    and segment of every run of x, in order."""

    tokens: np.ndarray
    valid: np.ndarray
    ok: np.ndarray
    weight: np.ndarray | None
    seg: np.ndarray
    pos: np.ndarray
    runs: np.ndarray


def _pieces(batch: PackedBatch, seq_len: int) -> tuple[np.ndarray, ...]:
    """Validate the pieces and place them in their rows.

    Returns:
        (B,) tokens per row; per piece its column, whether it starts a segment, and the column
        where its segment starts.

    Raises:
        EtlError: S < 2, or a row over S tokens (the packer ran with another S).
        EtlBug: no rows, rows unsorted or out of range, empty pieces, or segments that are
            not 1, 2, ... in each row: each a bug of the packer.
    """
    check_seq_len(seq_len)
    row = batch.row.astype(np.int64, copy=False)
    seg = batch.segment.astype(np.int64, copy=False)
    lengths = batch.pieces.lengths.astype(np.int64, copy=False)
    prev_row = np.concatenate([[-1], row[:-1]])
    new_row = row != prev_row
    step = seg - np.concatenate([[0], seg[:-1]]) * ~new_row  # a row starts from segment 0
    new_seg = step == 1
    bad = (row < prev_row) | (lengths < 1) | ((step != 0) & ~new_seg)
    in_range = len(row) == 0 or 0 <= row[0] <= row[-1] < batch.num_rows
    if batch.num_rows < 1 or bad.any() or not in_range:
        raise EtlBug(
            "malformed PackedBatch: it needs rows, pieces sorted by row and non-empty, "
            "segments numbered 1, 2, ... in each row; the packer that built it has a bug"
        )
    row_len = np.bincount(row, weights=lengths, minlength=batch.num_rows).astype(np.int64)
    if row_len.max() > seq_len:
        raise EtlError(
            f"a packed row holds {int(row_len.max())} tokens, more than seq_len={seq_len}; "
            "the packer must use the same seq_len as the collate"
        )
    col = (np.cumsum(lengths) - lengths) - (np.cumsum(row_len) - row_len)[row]
    base = col[np.maximum.accumulate(np.where(new_seg, np.arange(len(row)), 0))]
    return row_len, col, new_seg, base


def _take(flat: np.ndarray, src: np.ndarray) -> np.ndarray:
    """``flat[src]``; out-of-range cells (padding) read a clipped index and are never used."""
    if flat.size == 0:  # only when every row is padding
        return np.zeros(src.shape, dtype=flat.dtype)
    return np.take(flat, src, mode="clip")


# Rows of the item table built by `_items` (one column per item).
_LEN, _LEN_X, _SEG, _BASE, _SRC, _TRAINED, _PAD, _ROW, _COL, _RUN = range(10)


def _items(batch: PackedBatch, seq_len: int, width: int) -> np.ndarray:
    """(10, P + B) int64 item table in cell order: row 0's pieces, row 0's padding, row 1's ...

    Rows: cells of S (sum B x S); cells of x, ``width`` = T of them a row (at T = S - 1 a row's
    last non-empty item loses column S - 1);
    segment (0 on padding); column where the item's segment (or padding) starts; flat index of
    its first cell minus that column; trained; padding; row; first column; a run of x starts.
    One table, so the ~40 small numpy calls of per-column arrays become ~15 (each call's overhead:
    docs/design.md, Measured costs).
    """
    row_len, col, new_seg, base = _pieces(batch, seq_len)
    num = len(col)
    table = np.empty((10, num + batch.num_rows), dtype=np.int64)
    pieces, pads = table[:, :num], table[:, num:]
    pieces[_LEN] = pieces[_LEN_X] = batch.pieces.lengths
    pads[_LEN] = pads[_LEN_X] = seq_len - row_len
    pieces[_SEG], pads[_SEG] = batch.segment, 0
    pieces[_BASE], pads[_BASE] = base, row_len
    pieces[_SRC], pads[_SRC] = batch.pieces.starts - col, -row_len
    pieces[_TRAINED], pads[_TRAINED] = True if batch.trained is None else batch.trained, False
    pieces[_PAD], pads[_PAD] = False, True
    pieces[_ROW], pads[_ROW] = batch.row, np.arange(batch.num_rows)
    pieces[_COL], pads[_COL] = col, row_len
    pieces[_RUN], pads[_RUN] = new_seg, True
    # Cell order: piece j goes to slot j + row[j], row b's padding right after its last piece.
    pad_slot = np.cumsum(np.bincount(batch.row, minlength=batch.num_rows)) + np.arange(batch.num_rows)
    order = np.empty(num + batch.num_rows, dtype=np.int64)
    order[pieces[_ROW] + np.arange(num)] = np.arange(num)
    order[pad_slot] = num + np.arange(batch.num_rows)
    table = table[:, order]
    if width < seq_len:
        table[_LEN_X, np.where(row_len < seq_len, pad_slot, pad_slot - 1)] -= 1
    return table


def _grid(
    batch: PackedBatch, *, seq_len: int, width: int, use_loss_mask: bool, eos_id: int | None, boundary: bool
) -> _Grid:
    """Lay the pieces out in rows: (B, S) tokens and rules, (B, T) segments and positions, T =
    ``width`` (S - 1 or S).

    Each per-cell array is one ``np.repeat`` of an item row, cheaper than gathering through a
    cell -> item index (docs/design.md, Measured costs); temporaries are few (src, tokens).
    """
    it = _items(batch, seq_len, width)
    num_rows = batch.num_rows

    def cells(item_row: np.ndarray, over_x: bool = False) -> np.ndarray:
        return np.repeat(item_row, it[_LEN_X] if over_x else it[_LEN]).reshape(num_rows, -1)

    col = np.arange(seq_len, dtype=np.int64)
    src = cells(it[_SRC])
    src += col  # padding cells point out of range: clipped by `_take`, masked by `valid`
    tokens = _take(batch.pieces.ids, src)
    ok = cells(it[_TRAINED].astype(bool))  # False on padding
    if use_loss_mask:
        mask = _take(batch.pieces.mask, src)  # type: ignore[arg-type]
        ok &= mask if mask.dtype == np.bool_ else mask != 0  # uint8 or float32 (episode-style masks)
    if eos_id is not None:
        ok &= tokens != eos_id
    if boundary:  # no label is a document's first token: one write per document
        starts = it[_RUN] > it[_PAD]
        ok[it[_ROW, starts], it[_COL, starts]] = False
    # Padding counts from 0 as a run of its own: positions stay small and inside the table of
    # learned-position models; padding is never trained, so the values do not reach the loss.
    pos = cells(it[_BASE], over_x=True)
    np.subtract(col[:width], pos, out=pos)
    run = (it[_RUN] == 1) & (it[_COL] < width)  # runs that begin inside x
    weight = batch.pieces.weight
    return _Grid(
        tokens=tokens,
        valid=cells(it[_PAD] == 0),
        ok=ok,
        weight=None if weight is None else _take(weight, src).astype(np.float32, copy=False),
        seg=cells(it[_SEG].astype(np.int32), over_x=True),
        pos=pos,
        runs=np.stack([it[_ROW, run] * width + it[_COL, run], it[_ROW, run], it[_SEG, run]]),
    )


def _labels(g: _Grid, target: PackedTarget) -> tuple[np.ndarray, slice, np.ndarray]:
    """(B, T) trained labels, the token columns they read, and trained by x-position.

    ``"y"``: label i is token i + 1, predicted at x-position i. ``"labels"`` (T = S): label i
    is token i, predicted at x-position i - 1 by the model's own shift; column 0 is never a label.
    """
    if target == "y":
        trained = np.ascontiguousarray(g.ok[:, 1:])
        return trained, slice(1, None), trained
    trained = g.ok.copy()
    trained[:, 0] = False
    at_x = np.zeros_like(trained)
    at_x[:, :-1] = trained[:, 1:]
    return trained, slice(None), at_x


def _runs(g: _Grid, at_x: np.ndarray, num_seg: int) -> dict[str, np.ndarray]:
    """``cu_seqlens``, ``max_seqlen`` and ``segment_trained`` (B, num_seg) from the runs of x."""
    num_rows, width = g.seg.shape
    if num_rows * width >= 2**31:
        raise EtlError(f"B x T = {num_rows * width} overflows int32 cu_seqlens; use smaller B")
    bounds = np.append(g.runs[0], num_rows * width)
    counts = np.add.reduceat(at_x.reshape(-1).view(np.uint8), g.runs[0], dtype=np.int32)
    per_seg = np.zeros((num_rows, max(num_seg, 1) + 1), dtype=np.int32)
    per_seg[g.runs[1], g.runs[2]] = counts  # column 0: padding runs, never trained
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
    """Packed rows of S = seq_len tokens -> (B, T) arrays: T = S - 1 (target ``y``, as a padded
    batch has) or T = S (target ``labels``: the model shifts, so no token is lost).

    Trade-off: fixed shapes and ~no padding, but the model must read ``segment_ids`` (document
    mask, `etl.loader.attention`) and ``position_ids`` to train as if unpacked; otherwise it is
    chomp's stream semantics (attention crosses documents, only the loss is masked).

    A label is trained iff its token is real, its data mask is on (``use_loss_mask``), its
    piece's ``trained`` flag is set, it is not a document's first token
    (``mask_boundary_loss``) and, with ``train_on_eos=False``, it is not ``eos_id``.

    Args:
        batch: B rows of pieces (at most S tokens per row).
        seq_len: S, the tokens of a row (T = S - 1 for target ``y``, S for ``labels``).
        pad_id: id after a row's last piece (segment 0, never trained).
        use_loss_mask: False trains every real token (never padding).
        mask_dtype: dtype of ``loss_mask``: bool (the default collate) or np.float32 (the episode loader).
        ignore_index: label where not trained; None keeps the raw ids.
        target: ``"y"`` (``x`` = t[:-1], ``y`` = t[1:]) or ``"labels"`` (as transformers
            models take them: ``input_ids`` = ``labels`` = t, -100 where not trained and at
            column 0; the model shifts, so every token of a full row is predicted but the first).
        mask_boundary_loss: nothing predicts the next document's first token.
        train_on_eos: False ignores every label equal to ``eos_id``.
        eos_id: the eos id; required when ``train_on_eos`` is False.

    Returns:
        ``x``/``input_ids``, ``y``/``labels`` (B, T) int64; ``loss_mask`` aligned to the labels;
        ``attention_mask`` (B, T) bool; ``segment_ids`` (B, T) int32, 1..k, 0 on padding;
        ``position_ids`` (B, T) int64, 0 at each segment start (and at the padding's);
        ``cu_seqlens`` int32 bounds of the runs of equal (row, segment) over the flattened x,
        padding runs included so ``cu_seqlens[-1] == B * T`` (flash-attn varlen: each run
        attends to itself only); ``max_seqlen`` 0-d int32; ``segment_trained`` (B, K) int32
        trained labels whose x-position is in segment k + 1 (K = largest segment), so
        ``w = 1 / st.gather(1, (segment_ids - 1).clamp(min=0)).clamp(min=1)`` weights the loss
        per example; ``loss_weight`` (B, T) float32, 0 where untrained, if the data has weights.

    Raises:
        EtlError: a row over S tokens, no loss mask while ``use_loss_mask``, or
            ``train_on_eos=False`` without ``eos_id``.
        EtlBug: a malformed batch (a bug of the packer that built it).
    """
    if use_loss_mask and batch.pieces.mask is None:
        raise EtlError("the data has no loss mask; pass use_loss_mask=False to train on every token")
    if not train_on_eos and eos_id is None:
        raise EtlError("train_on_eos=False needs eos_id=<the tokenizer's eos token id>")
    if target not in ("y", "labels"):
        raise EtlError(f"target must be 'y' or 'labels', got {target!r}")
    width = seq_len if target == "labels" else seq_len - 1
    g = _grid(batch, seq_len=seq_len, width=width, use_loss_mask=use_loss_mask,
              eos_id=None if train_on_eos else eos_id, boundary=mask_boundary_loss)
    trained, cols, at_x = _labels(g, target)
    if ignore_index is None:  # raw ids: only padding is replaced
        labels = _fill(g.tokens[:, cols], g.valid[:, cols], pad_id)
    else:
        labels = _fill(g.tokens[:, cols], trained, ignore_index)
    x_name, label_name = ("x", "y") if target == "y" else ("input_ids", "labels")
    out = {
        x_name: _fill(g.tokens[:, :width], g.valid[:, :width], pad_id),
        label_name: labels,
        "loss_mask": trained.astype(mask_dtype, copy=False),
        "attention_mask": np.ascontiguousarray(g.valid[:, :width]),
        "segment_ids": g.seg,
        "position_ids": g.pos,
        **_runs(g, at_x, int(batch.segment.max(initial=0))),
    }
    if g.weight is not None:  # weights are finite, so 0 x (padding garbage) is 0
        out["loss_weight"] = np.multiply(g.weight[:, cols], trained, dtype=np.float32)
    return out


def _fill(values: np.ndarray, keep: np.ndarray, fill: int) -> np.ndarray:
    """int64 ``where(keep, values, fill)`` as a cast, then a masked fill of ``~keep``.

    Faster than np.where on masks made of runs (turn spans, padding); a random-looking mask would
    make the masked fill branch-mispredict and run slower than np.where (docs/design.md,
    Measured costs).
    """
    out = values.astype(np.int64)
    np.copyto(out, fill, where=~keep)
    return out


PACKED_COLLATE_FNS: dict[str, PackedCollateFn] = {"packed": collate_packed}
