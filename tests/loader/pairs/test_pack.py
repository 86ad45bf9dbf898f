"""Prefix-shared packing: hand-worked layouts, then random pairs against a per-pair reference.

The reference lays each pair out with Python lists (prompt, chosen, rejected; positions; the
predictor of each token in TRL's padded row mapped to the packed row), independently of the
vectorized collate.
"""

from __future__ import annotations

import numpy as np
import pytest

from etl.errors import EtlBug, EtlError
from etl.loader import collate_pairs_packed, pack_pairs, rows_from_examples
from etl.loader.pairs.pack import PART_CHOSEN, PART_PAD, PART_PROMPT, PART_REJECTED, PackedPairs

P_, C_, R_, X_ = PART_PROMPT, PART_CHOSEN, PART_REJECTED, PART_PAD


def test_two_rows_by_hand() -> None:
    pairs = [{"prompt_ids": [1, 2, 3], "chosen_ids": [4, 5], "rejected_ids": [6], "chosen_mask": [True, False]},
             {"prompt_ids": [7], "chosen_ids": [8], "rejected_ids": [9, 10]},
             {"prompt_ids": [11, 12], "chosen_ids": [13], "rejected_ids": [14]}]
    rows = rows_from_examples(pairs)
    out = collate_pairs_packed(PackedPairs(rows, np.array([0, 1, 1]), 2), seq_len=9, pad_id=0)
    assert out["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 0, 0, 0], [7, 8, 9, 10, 11, 12, 13, 14, 0]]
    # rejected restarts at P; padding counts from 0
    assert out["position_ids"].tolist() == [[0, 1, 2, 3, 4, 3, 0, 1, 2], [0, 1, 1, 2, 0, 1, 2, 2, 0]]
    assert out["pair_ids"].tolist() == [[1, 1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 2, 2, 2, 2, 0]]
    assert out["part_ids"].tolist() == [[P_, P_, P_, C_, C_, R_, X_, X_, X_], [P_, C_, R_, R_, P_, P_, C_, R_, X_]]
    # token 5 untrained by its chosen_mask
    assert out["completion_mask"].tolist() == [[0, 0, 0, 1, 0, 1, 0, 0, 0], [0, 1, 1, 1, 0, 0, 1, 1, 0]]
    # the first rejected token (6, 9, 14) is predicted by the last prompt token (3, 7, 12)
    assert out["logits_index"].tolist() == [[0, 0, 1, 2, 3, 2, 5, 6, 7], [0, 0, 0, 2, 3, 4, 5, 5, 7]]
    assert out["input_ids"].dtype == out["position_ids"].dtype == out["logits_index"].dtype == np.int64


def test_a_pair_without_prompt_scores_no_first_token() -> None:
    rows = rows_from_examples([{"prompt_ids": [5], "chosen_ids": [6], "rejected_ids": [7]},
                               {"prompt_ids": [], "chosen_ids": [8, 9], "rejected_ids": [10, 11]}])
    out = collate_pairs_packed(PackedPairs(rows, np.array([0, 0]), 1), seq_len=8, pad_id=0)
    # pair 2's first chosen and first rejected tokens have nothing of their own pair before them
    assert out["completion_mask"].tolist() == [[0, 1, 1, 0, 1, 0, 1, 0]]


def reference(pair: dict, start: int) -> dict[str, list[int]]:
    """One pair's cells in a packed row starting at column ``start``, by hand."""
    p, c, r = (list(pair[k]) for k in ("prompt_ids", "chosen_ids", "rejected_ids"))
    cm, rm = list(pair["chosen_mask"]), list(pair["rejected_mask"])
    # TRL's rows: chosen = p + c, rejected = p + r; token t of a row predicted by t - 1.
    # Map the padded columns to packed ones: chosen row j -> start + j; rejected row j -> start + j
    # for j < P, start + C + j after.
    rej_col = [start + j if j < len(p) else start + len(c) + j for j in range(len(p) + len(r))]
    return {
        "input_ids": p + c + r,
        "position_ids": list(range(len(p) + len(c))) + list(range(len(p), len(p) + len(r))),
        "part_ids": [P_] * len(p) + [C_] * len(c) + [R_] * len(r),
        "completion_mask": [0] * len(p) + [int(m and len(p) + j > 0) for j, m in enumerate(cm)]
                           + [int(m and len(p) + j > 0) for j, m in enumerate(rm)],
        "logits_index": [max(start + j - 1, 0) for j in range(len(p) + len(c))]
                        + [rej_col[len(p) + j - 1] if len(p) + j > 0 else start - 1 for j in range(len(r))],
    }


@pytest.mark.parametrize("seed", range(6))
def test_random_pairs_match_the_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(int(rng.integers(1, 30))):
        p, c, r = (int(rng.integers(lo, 9)) for lo in (0 if seed == 5 else 1, 1, 1))
        pairs.append({"prompt_ids": rng.integers(0, 99, p), "chosen_ids": rng.integers(0, 99, c),
                      "rejected_ids": rng.integers(0, 99, r), "chosen_mask": rng.random(c) < 0.7,
                      "rejected_mask": rng.random(r) < 0.7})
    seq_len = int(rng.integers(12, 40))
    rows = rows_from_examples(pairs)
    packed, order, skipped = pack_pairs(rows, seq_len=seq_len)
    out = collate_pairs_packed(packed, seq_len=seq_len, pad_id=-1)
    lengths = rows.lengths
    assert skipped.tolist() == np.flatnonzero(lengths > seq_len).tolist()
    assert sorted(order.tolist() + skipped.tolist()) == list(range(len(pairs)))
    seen = 0
    for b in range(out["input_ids"].shape[0]):
        col = 0
        for k in range(1, int(out["pair_ids"][b].max()) + 1):
            want = reference(pairs[order[seen]], col)
            cols = np.flatnonzero(out["pair_ids"][b] == k)
            assert cols.tolist() == list(range(col, col + len(want["input_ids"])))
            for key, values in want.items():
                got = out[key][b, cols].tolist()
                if key == "logits_index":  # unscored tokens may point anywhere
                    got = [g if m else v for g, v, m in zip(got, values, want["completion_mask"], strict=True)]
                assert got == values, (key, b, k)
            col, seen = col + len(cols), seen + 1
        assert (out["input_ids"][b, col:] == -1).all() and (out["part_ids"][b, col:] == PART_PAD).all()
    assert seen == len(order)


def test_over_long_pairs_are_skipped_and_named() -> None:
    rows = rows_from_examples([{"prompt_ids": [1] * 5, "chosen_ids": [2] * 5, "rejected_ids": [3] * 5},
                               {"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3]}])
    packed, order, skipped = pack_pairs(rows, seq_len=8)
    assert order.tolist() == [1] and skipped.tolist() == [0] and packed.num_rows == 1
    with pytest.raises(EtlError, match="no pair fits"):
        pack_pairs(rows.take(np.array([0])), seq_len=8)
    with pytest.raises(EtlError, match="keeps pairs whole"):
        pack_pairs(rows, seq_len=8, strategy="sequential")
    with pytest.raises(EtlError, match="more than seq_len=8"):
        collate_pairs_packed(PackedPairs(rows, np.array([0, 0]), 1), seq_len=8, pad_id=0)
    with pytest.raises(EtlBug, match="malformed"):
        collate_pairs_packed(PackedPairs(rows, np.array([1, 0]), 2), seq_len=32, pad_id=0)
