"""Collate: hand-worked golden batches, and properties against a per-example reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.columns import IGNORE_INDEX, INPUT_IDS, LOSS_MASK, LOSS_WEIGHT
from etl.errors import EtlError
from etl.loader.collate import COLLATE_FNS, collate, collate_fixed, collate_longest, resolve_pad_id
from etl.ragged import Ragged, concat, from_examples

F, T_ = False, True
A = ([10, 11, 12, 13], [F, F, T_, T_])
B = ([20, 21], [F, T_])
C = ([30, 31, 32, 33, 34, 35, 36], [F, F, T_, F, T_, T_, T_])


def ragged(*examples: tuple[list[int], list[bool]]) -> Ragged:
    return from_examples(
        [{INPUT_IDS: np.array(i, np.int32), LOSS_MASK: np.array(m)} for i, m in examples]
    )


def test_golden_fixed_pad_and_shift() -> None:
    # S = 5 (T = 4), pad 0. A: t=[10,11,12,13,0] m=[0,0,1,1,0]; B: t=[20,21,0,0,0] m=[0,1,0,0,0].
    out = collate_fixed(ragged(A, B), seq_len=5, pad_id=0)
    assert out["x"].dtype == np.int64 and out["y"].dtype == np.int64
    assert out["x"].tolist() == [[10, 11, 12, 13], [20, 21, 0, 0]]
    assert out["y"].tolist() == [[-100, 12, 13, -100], [21, -100, -100, -100]]
    assert out["loss_mask"].dtype == np.bool_
    assert out["loss_mask"].astype(int).tolist() == [[0, 1, 1, 0], [1, 0, 0, 0]]
    assert out["attention_mask"].astype(int).tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert set(out) == {"x", "y", "loss_mask", "attention_mask"}


def test_golden_without_loss_mask_trains_every_real_token_but_not_padding() -> None:
    out = collate_fixed(ragged(A, B), seq_len=5, pad_id=0, use_loss_mask=False)
    assert out["y"].tolist() == [[11, 12, 13, -100], [21, -100, -100, -100]]
    assert out["loss_mask"].astype(int).tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]


def test_golden_float_mask_raw_y_and_pad_id() -> None:
    # Seed 002 shape: y keeps raw ids (pad 7 after the end), mask float32 aligned to y.
    out = collate_fixed(ragged(B), seq_len=5, pad_id=7, mask_dtype=np.float32, ignore_index=None)
    assert out["x"].tolist() == [[20, 21, 7, 7]]
    assert out["y"].tolist() == [[21, 7, 7, 7]]
    assert out["loss_mask"].dtype == np.float32
    assert out["loss_mask"].tolist() == [[1.0, 0.0, 0.0, 0.0]]


def test_golden_truncation_right_keeps_prefix_left_keeps_end() -> None:
    right = collate_fixed(ragged(C), seq_len=5, pad_id=0, truncation="right")
    assert right["x"].tolist() == [[30, 31, 32, 33]]
    assert right["y"].tolist() == [[-100, 32, -100, 34]]
    left = collate_fixed(ragged(C), seq_len=5, pad_id=0, truncation="left")
    assert left["x"].tolist() == [[32, 33, 34, 35]]
    assert left["y"].tolist() == [[-100, 34, 35, 36]]
    assert left["attention_mask"].all()


def test_golden_loss_weights_align_to_y() -> None:
    batch = from_examples(
        [
            {
                INPUT_IDS: np.array(A[0]),
                LOSS_MASK: np.array(A[1]),
                LOSS_WEIGHT: np.array([0.5, 0.5, 2, 3]),
            },
            {INPUT_IDS: np.array(B[0]), LOSS_MASK: np.array(B[1]), LOSS_WEIGHT: np.array([1, 1.5])},
        ]
    )
    out = collate_fixed(batch, seq_len=5, pad_id=0)
    assert out["loss_weight"].dtype == np.float32
    assert out["loss_weight"].tolist() == [[0, 2, 3, 0], [1.5, 0, 0, 0]]


@pytest.mark.parametrize(("multiple", "t"), [(1, 3), (2, 4), (8, 8), (64, 15)])
def test_golden_longest_rounds_t_up_and_caps_at_seq_len(multiple: int, t: int) -> None:
    # Longest example has 4 tokens -> 3 targets; T rounds up to the multiple, capped at S-1 = 15.
    out = collate_longest(ragged(A, B), seq_len=16, pad_id=0, pad_multiple=multiple)
    assert out["x"].shape == (2, t)
    assert out["y"][0, :3].tolist() == [-100, 12, 13]
    assert (out["y"][:, 3:] == IGNORE_INDEX).all()


def test_ragged_take_concat_reorder_keep_examples_intact() -> None:
    r = ragged(A, B, C)
    part = concat([r.take(np.array([2, 0])), r.take(np.array([1]))]).reorder(np.array([2, 0, 1]))
    got = [part.ids[s : s + n].tolist() for s, n in zip(part.starts, part.lengths, strict=True)]
    assert got == [B[0], C[0], A[0]]
    masks = [part.mask[s : s + n].tolist() for s, n in zip(part.starts, part.lengths, strict=True)]
    assert masks == [B[1], C[1], A[1]]


def test_empty_examples_and_errors() -> None:
    out = collate_fixed(ragged(([], [])), seq_len=3, pad_id=5)
    assert out["x"].tolist() == [[5, 5]] and out["y"].tolist() == [[-100, -100]]
    assert not out["attention_mask"].any()
    with pytest.raises(EtlError, match="use_loss_mask=False"):
        collate_fixed(Ragged(np.arange(3), np.array([0]), np.array([3])), seq_len=4, pad_id=0)
    with pytest.raises(EtlError, match="at least 2"):
        collate_fixed(ragged(A), seq_len=1, pad_id=0)
    with pytest.raises(EtlError, match="unknown collate"):
        collate([{INPUT_IDS: np.array([1])}], strategy="nope", seq_len=4, pad_id=0)
    with pytest.raises(EtlError, match="empty batch"):
        collate([], seq_len=4, pad_id=0)


def test_resolve_pad_id_order() -> None:
    assert resolve_pad_id(9, {"pad_id": 1, "eot_id": 2}) == 9
    assert resolve_pad_id(None, {"pad_id": 1, "eot_id": 2}) == 1
    assert resolve_pad_id(None, {"pad_id": None, "eot_id": 2}) == 2
    with pytest.raises(EtlError, match="pass pad_id"):
        resolve_pad_id(None, {"tokenizer": "x"})


def reference(examples, *, seq_len, pad_id, use_loss_mask, truncation):
    """Per-example, per-token reference: the obvious loops the vectorized code must agree with."""
    xs, ys, ms, atts = [], [], [], []
    for ids, mask in examples:
        ids, mask = list(ids), list(mask)
        if len(ids) > seq_len:
            cut = slice(len(ids) - seq_len, None) if truncation == "left" else slice(0, seq_len)
            ids, mask = ids[cut], mask[cut]
        n = len(ids)
        t = ids + [pad_id] * (seq_len - n)
        m = mask + [False] * (seq_len - n)
        x, y, lm = [], [], []
        for i in range(seq_len - 1):
            trained = i + 1 < n and (m[i + 1] or not use_loss_mask)
            x.append(t[i])
            y.append(t[i + 1] if trained else IGNORE_INDEX)
            lm.append(trained)
        xs.append(x), ys.append(y), ms.append(lm), atts.append([i < n for i in range(seq_len - 1)])
    return xs, ys, ms, atts


example = st.integers(0, 12).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n),
        st.lists(st.booleans(), min_size=n, max_size=n),
    )
)


@settings(max_examples=150, deadline=None)
@given(
    examples=st.lists(example, min_size=1, max_size=6),
    seq_len=st.integers(2, 14),
    pad_id=st.integers(0, 50),
    use_loss_mask=st.booleans(),
    truncation=st.sampled_from(["right", "left"]),
)
def test_property_fixed_matches_reference(
    examples, seq_len, pad_id, use_loss_mask, truncation
) -> None:
    out = collate(
        ragged(*examples),
        strategy="fixed",
        seq_len=seq_len,
        pad_id=pad_id,
        use_loss_mask=use_loss_mask,
        truncation=truncation,
    )
    xs, ys, ms, atts = reference(
        examples, seq_len=seq_len, pad_id=pad_id, use_loss_mask=use_loss_mask, truncation=truncation
    )
    assert out["x"].tolist() == xs
    assert out["y"].tolist() == ys
    assert out["loss_mask"].tolist() == ms
    assert out["attention_mask"].tolist() == atts


@settings(max_examples=100, deadline=None)
@given(examples=st.lists(example, min_size=1, max_size=6), multiple=st.integers(1, 8))
def test_property_longest_is_a_prefix_of_fixed(examples, multiple) -> None:
    fixed = collate_fixed(ragged(*examples), seq_len=14, pad_id=3)
    dyn = COLLATE_FNS["longest"](ragged(*examples), seq_len=14, pad_id=3, pad_multiple=multiple)
    t = dyn["x"].shape[1]
    assert t % multiple == 0 or t == 13
    assert t >= min(max(len(i) for i, _ in examples) - 1, 13)
    for key in ("x", "y", "loss_mask", "attention_mask"):
        assert dyn[key].tolist() == fixed[key][:, :t].tolist()
    assert (fixed["y"][:, t:] == IGNORE_INDEX).all()


@settings(max_examples=100, deadline=None)
@given(examples=st.lists(example, min_size=1, max_size=5), seq_len=st.integers(13, 16))
def test_property_matches_seed_000_collate_sft_batch(examples, seq_len) -> None:
    sft = pytest.importorskip("etl.sft")
    # No example exceeds S here, so seed 000's pack only pads; role ids lie outside the data.
    roles = {"sys_id": -1, "usr_id": -2, "asst_id": -3, "eot_id": -4}
    packed = [
        sft.pack_sft_ids_and_mask(list(i), list(m), S=seq_len, pad_id=9, **roles)
        for i, m in examples
    ]
    x, y, loss_mask = sft.collate_sft_batch(packed, T=seq_len - 1, device="cpu")
    out = collate_fixed(ragged(*examples), seq_len=seq_len, pad_id=9)
    assert out["x"].tolist() == x.tolist()
    assert out["y"].tolist() == y.tolist()
    assert out["loss_mask"].tolist() == loss_mask.tolist()
