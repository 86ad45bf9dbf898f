"""Packed collate: a hand-worked golden batch, error messages, and hypothesis properties.

The properties run over random `PackedBatch`es (pieces anywhere in a flat buffer, several
pieces per segment, masks, trained flags, weights) against a per-row Python reference.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.columns import IGNORE_INDEX
from etl.errors import EtlBug, EtlError
from etl.loader.collate_packed import PACKED_COLLATE_FNS, collate_packed
from etl.ragged import PackedBatch, Ragged

# Golden batch, S = 8 (T = 7), pad 0. The pieces sit anywhere in the flat buffer (99, 98 unused):
#   A = 10 11 12     mask 0 1 1    weight 1 2 3       row 0, segment 1
#   B = 20 21 22 23  mask 1 0 1 1  weight 4 5 6 7     row 0, segment 2
#   C = 30 31 32 33 34  mask 0 1 0 1 1  weight 8..12  row 1, segment 1
# Row 0: t = 10 11 12 20 21 22 23 0   seg 1 1 1 2 2 2 2 0   mask 0 1 1 1 0 1 1 0
# Row 1: t = 30 31 32 33 34 0 0 0     seg 1 1 1 1 1 0 0 0   mask 0 1 0 1 1 0 0 0
FLAT = np.array([99, 30, 31, 32, 33, 34, 10, 11, 12, 98, 20, 21, 22, 23], np.int32)
MASK = np.array([1, 0, 1, 0, 1, 1, 0, 1, 1, 1, 1, 0, 1, 1], bool)
WEIGHT = np.array([0, 8, 9, 10, 11, 12, 1, 2, 3, 0, 4, 5, 6, 7], np.float32)
N = IGNORE_INDEX


def golden(trained: np.ndarray | None = None) -> PackedBatch:
    pieces = Ragged(FLAT, np.array([6, 10, 1]), np.array([3, 4, 5]), MASK, WEIGHT)
    return PackedBatch(pieces, np.array([0, 0, 1]), np.array([1, 2, 1]), 2, trained)


def test_golden_y_target_every_output() -> None:
    out = collate_packed(golden(), seq_len=8, pad_id=0)
    assert out["x"].tolist() == [[10, 11, 12, 20, 21, 22, 23], [30, 31, 32, 33, 34, 0, 0]]
    # Label i is token i + 1: 20 (mask on) is B's first token, so the boundary rule drops it.
    assert out["y"].tolist() == [[11, 12, N, N, 22, 23, N], [31, N, 33, 34, N, N, N]]
    assert out["loss_mask"].astype(int).tolist() == [[1, 1, 0, 0, 1, 1, 0], [1, 0, 1, 1, 0, 0, 0]]
    assert out["attention_mask"].astype(int).tolist() == [[1] * 7, [1] * 5 + [0, 0]]
    assert out["segment_ids"].tolist() == [[1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 1, 0, 0]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3], [0, 1, 2, 3, 4, 0, 1]]
    # Runs over the flattened 2 x 7 x: A [0, 3), B [3, 7), C [7, 12), row 1's padding [12, 14).
    assert out["cu_seqlens"].tolist() == [0, 3, 7, 12, 14]
    assert out["max_seqlen"].shape == () and int(out["max_seqlen"]) == 5
    assert out["segment_trained"].tolist() == [[2, 2], [3, 0]]
    assert out["loss_weight"].tolist() == [[2, 3, 0, 0, 6, 7, 0], [9, 0, 11, 12, 0, 0, 0]]
    dtypes = {k: v.dtype for k, v in out.items()}
    assert dtypes == {
        "x": np.int64, "y": np.int64, "loss_mask": np.bool_, "attention_mask": np.bool_,
        "segment_ids": np.int32, "position_ids": np.int64, "cu_seqlens": np.int32,
        "max_seqlen": np.int32, "segment_trained": np.int32, "loss_weight": np.float32,
    }


def test_golden_labels_target_model_shifts() -> None:
    out = collate_packed(golden(), seq_len=8, pad_id=0, target="labels")
    # T = S = 8: the model shifts, so the rows keep all S tokens (row 0's 8th cell is padding).
    assert out["input_ids"].tolist() == [[10, 11, 12, 20, 21, 22, 23, 0], [30, 31, 32, 33, 34, 0, 0, 0]]
    # Label i is token i itself; column 0 and each document's first token are never labels.
    assert out["labels"].tolist() == [[N, 11, 12, N, N, 22, 23, N], [N, 31, N, 33, 34, N, N, N]]
    assert out["loss_mask"].astype(int).tolist() == [[0, 1, 1, 0, 0, 1, 1, 0], [0, 1, 0, 1, 1, 0, 0, 0]]
    assert out["attention_mask"].astype(int).tolist() == [[1] * 7 + [0], [1] * 5 + [0] * 3]
    assert out["segment_ids"].tolist() == [[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 1, 1, 1, 0, 0, 0]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 2, 3, 4, 0, 1, 2]]
    # Runs over the flattened 2 x 8: A [0, 3), B [3, 7), pad [7, 8), C [8, 13), pad [13, 16).
    assert out["cu_seqlens"].tolist() == [0, 3, 7, 8, 13, 16] and int(out["max_seqlen"]) == 5
    assert out["segment_trained"].tolist() == [[2, 2], [3, 0]]
    assert out["loss_weight"].tolist() == [[0, 2, 3, 0, 0, 6, 7, 0], [0, 9, 0, 11, 12, 0, 0, 0]]
    assert "x" not in out and "y" not in out


def test_golden_knobs_boundary_eos_trained_raw() -> None:
    kw = {"seq_len": 8, "pad_id": 0}
    off = collate_packed(golden(), mask_boundary_loss=False, **kw)
    assert off["y"][0].tolist() == [11, 12, 20, N, 22, 23, N]  # 12 -> 20 crosses A | B
    assert off["segment_trained"].tolist() == [[3, 2], [3, 0]]  # counted at x-position 2 (A)
    eos = collate_packed(golden(), train_on_eos=False, eos_id=23, **kw)
    assert eos["y"][0].tolist() == [11, 12, N, N, 22, N, N]
    flags = collate_packed(golden(np.array([True, False, True])), **kw)
    assert flags["y"].tolist() == [[11, 12, N, N, N, N, N], [31, N, 33, 34, N, N, N]]
    raw = collate_packed(golden(), seq_len=8, pad_id=7, ignore_index=None, mask_dtype=np.float32)
    assert raw["y"].tolist() == [[11, 12, 20, 21, 22, 23, 7], [31, 32, 33, 34, 7, 7, 7]]
    assert raw["x"][1].tolist() == [30, 31, 32, 33, 34, 7, 7]
    assert raw["loss_mask"].dtype == np.float32
    stored = golden()  # seed 002 stores masks as float32 or uint8: nonzero is trained
    for dtype in (np.float32, np.uint8):
        pieces = Ragged(FLAT, stored.pieces.starts, stored.pieces.lengths, MASK.astype(dtype))
        as_stored = PackedBatch(pieces, stored.row, stored.segment, 2)
        got = collate_packed(as_stored, **kw)["y"]
        np.testing.assert_array_equal(got, collate_packed(stored, **kw)["y"])
    every = collate_packed(golden(), use_loss_mask=False, **kw)
    assert every["y"].tolist() == [[11, 12, N, 21, 22, 23, N], [31, 32, 33, 34, N, N, N]]


def test_full_row_labels_target_keeps_every_token() -> None:
    pieces = Ragged(np.arange(10, 14), np.array([0]), np.array([4]), np.ones(4, bool))
    batch = PackedBatch(pieces, np.array([0]), np.array([1]), 1)
    assert collate_packed(batch, seq_len=4, pad_id=0)["y"].tolist() == [[11, 12, 13]]
    out = collate_packed(batch, seq_len=4, pad_id=0, target="labels")
    assert out["input_ids"].tolist() == [[10, 11, 12, 13]]  # all S tokens of the full pack
    assert out["labels"].tolist() == [[N, 11, 12, 13]]
    # The model's shift (logits[:, :-1] against labels[:, 1:]) trains 11, 12, 13: y's targets.
    assert out["labels"][:, 1:].tolist() == collate_packed(batch, seq_len=4, pad_id=0)["y"].tolist()


def test_empty_rows_and_registry() -> None:
    empty = Ragged(np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64))
    batch = PackedBatch(empty, np.zeros(0, np.int64), np.zeros(0, np.int64), 2)
    out = PACKED_COLLATE_FNS["packed"](batch, seq_len=4, pad_id=5, use_loss_mask=False)
    assert out["x"].tolist() == [[5, 5, 5]] * 2 and out["segment_ids"].tolist() == [[0] * 3] * 2
    assert out["cu_seqlens"].tolist() == [0, 3, 6] and out["segment_trained"].tolist() == [[0]] * 2


@pytest.mark.parametrize(
    ("change", "kw", "match"),
    [
        ({"seq_len": 6}, {}, "more than seq_len=6"),
        ({}, {"train_on_eos": False}, "eos_id"),
        ({"mask": None}, {}, "use_loss_mask=False"),
        ({"row": np.array([1, 0, 1])}, {}, "malformed"),
        ({"row": np.array([-1, -1, 0])}, {}, "malformed"),
        ({"row": np.array([0, 0, 2])}, {}, "malformed"),
        ({"segment": np.array([1, 3, 1])}, {}, "malformed"),
        ({}, {"target": "z"}, "target"),
    ],
)
def test_errors_say_how_to_fix(change: dict, kw: dict, match: str) -> None:
    pieces = Ragged(FLAT, np.array([6, 10, 1]), np.array([3, 4, 5]), change.get("mask", MASK))
    row = change.get("row", np.array([0, 0, 1]))
    batch = PackedBatch(pieces, row, change.get("segment", np.array([1, 2, 1])), 2)
    # A malformed batch is the packer's bug (the CLI exits 1), the others the caller's to fix.
    with pytest.raises(EtlBug if match == "malformed" else EtlError, match=match):
        collate_packed(batch, seq_len=change.get("seq_len", 8), pad_id=0, **kw)


# --- Properties over random packed batches --------------------------------------------------

EOS = 3


@st.composite
def packed_batches(draw: st.DrawFn) -> tuple[PackedBatch, int]:
    """Random rows of segments of 1-2 pieces each, filled greedily up to S; flags optional."""
    seq_len = draw(st.integers(2, 20))
    pool = draw(st.integers(1, 30))
    flat = np.array(draw(st.lists(st.integers(0, 9), min_size=pool, max_size=pool)), np.int32)
    mask = np.array(draw(st.lists(st.booleans(), min_size=pool, max_size=pool)))
    starts, lengths, rows, segs = [], [], [], []
    num_rows = draw(st.integers(1, 4))
    for b in range(num_rows):
        used = 0
        for seg in range(1, draw(st.integers(0, 5)) + 1):
            for _ in range(draw(st.integers(1, 2))):
                length = draw(st.integers(1, min(pool, 7)))
                if used + length > seq_len:
                    break
                starts.append(draw(st.integers(0, pool - length)))
                lengths.append(length)
                rows.append(b)
                segs.append(seg)
                used += length
            if not segs or segs[-1] != seg or rows[-1] != b:
                break  # the segment got no piece: the row is full
    pieces = Ragged(
        flat,
        np.array(starts, np.int64),
        np.array(lengths, np.int64),
        mask,
        np.linspace(0.5, 2.0, pool).astype(np.float32) if draw(st.booleans()) else None,
    )
    trained = None
    if draw(st.booleans()):
        trained = np.array(draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows))))
    return PackedBatch(pieces, np.array(rows, np.int64), np.array(segs, np.int64), num_rows,
                       trained), seq_len


def reference_rows(batch: PackedBatch, seq_len: int) -> list[dict[str, list]]:
    """Per row, in plain Python: tokens, segment, data mask, piece flag, weight; then padding."""
    out = [{"t": [], "seg": [], "mask": [], "flag": [], "w": []} for _ in range(batch.num_rows)]
    p = batch.pieces
    for j, (b, k) in enumerate(zip(batch.row.tolist(), batch.segment.tolist(), strict=True)):
        span = range(int(p.starts[j]), int(p.starts[j] + p.lengths[j]))
        out[b]["t"] += [int(p.ids[i]) for i in span]
        out[b]["seg"] += [k] * len(span)
        out[b]["mask"] += [bool(p.mask[i]) for i in span]
        flag = True if batch.trained is None else bool(batch.trained[j])
        out[b]["flag"] += [flag] * len(span)
        out[b]["w"] += [0.0 if p.weight is None else float(p.weight[i]) for i in span]
    for r in out:
        r["real"] = len(r["t"])
        pad = seq_len - r["real"]
        r["t"] += [-1] * pad  # the pad id the tests pass
        r["seg"] += [0] * pad
        for key, fill in (("mask", False), ("flag", False), ("w", 0.0)):
            r[key] += [fill] * pad
    return out


def label_rule(r: dict, i: int, *, boundary: bool, eos: int | None, use_mask: bool) -> bool:
    """Is token i of the row a trained label (predicted from token i - 1)?"""
    return (
        i < r["real"]
        and (r["mask"][i] or not use_mask)
        and r["flag"][i]
        and (not boundary or r["seg"][i] == r["seg"][i - 1])
        and (eos is None or r["t"][i] != eos)
    )


KNOBS = st.fixed_dictionaries(
    {"boundary": st.booleans(), "eos": st.sampled_from([None, EOS]), "use_mask": st.booleans()}
)


def run(batch: PackedBatch, seq_len: int, knobs: dict, **kw: object) -> dict[str, np.ndarray]:
    return collate_packed(
        batch,
        seq_len=seq_len,
        pad_id=-1,
        use_loss_mask=knobs["use_mask"],
        mask_boundary_loss=knobs["boundary"],
        train_on_eos=knobs["eos"] is None,
        eos_id=knobs["eos"],
        **kw,  # type: ignore[arg-type]
    )


@settings(max_examples=150, deadline=None)
@given(packed_batches(), KNOBS)
def test_matches_the_per_row_reference(case: tuple[PackedBatch, int], knobs: dict) -> None:
    batch, seq_len = case
    out = run(batch, seq_len, knobs)
    lab = run(batch, seq_len, knobs, target="labels")
    for b, r in enumerate(reference_rows(batch, seq_len)):
        rule = [label_rule(r, i, **knobs) for i in range(seq_len)]
        assert out["x"][b].tolist() == r["t"][:-1] and lab["input_ids"][b].tolist() == r["t"]
        assert out["y"][b].tolist() == [t if ok else N for t, ok in zip(r["t"][1:], rule[1:])]
        want_labels = [N] + [t if ok else N for t, ok in zip(r["t"][1:], rule[1:])]
        assert lab["labels"][b].tolist() == want_labels
        assert lab["attention_mask"][b].tolist() == [i < r["real"] for i in range(seq_len)]
        assert lab["segment_ids"][b].tolist() == r["seg"]
        assert out["attention_mask"][b].tolist() == [i < r["real"] for i in range(seq_len - 1)]
        assert out["segment_ids"][b].tolist() == r["seg"][:-1]
        if "loss_weight" in out:
            w = [w if ok else 0.0 for w, ok in zip(r["w"][1:], rule[1:])]
            np.testing.assert_allclose(out["loss_weight"][b], w)
    np.testing.assert_array_equal(out["segment_ids"], lab["segment_ids"][:, :-1])
    np.testing.assert_array_equal(out["position_ids"], lab["position_ids"][:, :-1])
    np.testing.assert_array_equal(out["segment_trained"], lab["segment_trained"])


@settings(max_examples=150, deadline=None)
@given(packed_batches(), KNOBS)
def test_document_properties(case: tuple[PackedBatch, int], knobs: dict) -> None:
    batch, seq_len = case
    out = run(batch, seq_len, knobs)
    seg, pos, y = out["segment_ids"], out["position_ids"], out["y"]
    raw = run(batch, seq_len, knobs, ignore_index=None)["y"]
    for b in range(batch.num_rows):
        # Position ids count from 0 in every run of equal segment (padding is a run too).
        runs = [len(list(g)) for _, g in itertools.groupby(seg[b].tolist())]
        assert pos[b].tolist() == [i for n in runs for i in range(n)]
        # Padding: pad id, segment 0, never trained, only at the end of the row.
        pad = ~out["attention_mask"][b]
        assert (seg[b][pad] == 0).all() and (out["x"][b][pad] == -1).all()
        assert (seg[b][~pad] > 0).all() and not pad[: int((~pad).sum())].any()
    # No trained label crosses a boundary: y[i] is token i + 1 of x-position i's segment.
    seg_tokens = np.array([r["seg"] for r in reference_rows(batch, seq_len)])  # (B, S)
    trained = y != N
    assert (out["loss_mask"] == trained).all() and (seg[trained] > 0).all()
    if knobs["boundary"]:
        assert (seg_tokens[:, 1:][trained] == seg[trained]).all()
    # cu_seqlens: the runs of equal (row, segment) over the flattened x, padding runs included.
    flat = (np.arange(batch.num_rows)[:, None] * (seq_len + 1) + seg).reshape(-1)
    edges = [0] + [i for i in range(1, flat.size) if flat[i] != flat[i - 1]] + [flat.size]
    assert out["cu_seqlens"].tolist() == edges
    assert int(out["max_seqlen"]) == max(np.diff(edges))
    # segment_trained: per row it sums to the row's trained labels, per segment it counts them.
    st_ = out["segment_trained"]
    assert st_.shape == (batch.num_rows, max(int(batch.segment.max(initial=0)), 1))
    assert (st_.sum(1) == trained.sum(1)).all()
    for k in range(st_.shape[1]):
        assert (st_[:, k] == (trained & (seg == k + 1)).sum(1)).all()
    # Every piece's tokens appear in the row in order, back to back (x then y's last token).
    row_tokens = np.concatenate([out["x"], raw[:, -1:]], axis=1)
    col = np.zeros(batch.num_rows, np.int64)
    p = batch.pieces
    for j, b in enumerate(batch.row.tolist()):
        n = int(p.lengths[j])
        want = p.ids[p.starts[j] : p.starts[j] + n]
        assert row_tokens[b, col[b] : col[b] + n].tolist() == want.tolist()
        col[b] += n


@settings(max_examples=100, deadline=None)
@given(packed_batches(), st.booleans())
def test_train_on_eos_off_removes_exactly_the_eos_labels(
    case: tuple[PackedBatch, int], boundary: bool
) -> None:
    batch, seq_len = case
    on = run(batch, seq_len, {"boundary": boundary, "eos": None, "use_mask": True})
    off = run(batch, seq_len, {"boundary": boundary, "eos": EOS, "use_mask": True})
    removed = (on["y"] != N) & (off["y"] == N)
    assert (on["y"][removed] == EOS).all()
    assert ((on["y"] == EOS) == removed).all()
    assert (off["y"] != EOS).all()
