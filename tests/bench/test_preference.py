"""bench/preference.py's layout arithmetic on hand-worked lengths (the timed part needs ../shared)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # as bench/results.py imports it

from preference import layout_table


def test_padded_and_packed_tokens_from_lengths() -> None:
    p, ch, rj = np.array([10, 5, 3]), np.array([4, 20, 1]), np.array([6, 2, 1])
    lines = layout_table(p, ch, rj, batch_size=2, seq_len=32)
    # Padded: pairs 0-1 pad to max(16, 25) = 25 -> 2 * 2 * 25 = 100; pair 2 -> 2 * 1 * 4 = 8.
    # Real: 2P + C + R = 30 + 32 + 8 = 70, so 1 - 70 / 108 padding.
    assert lines[2] == "| padded, B = 2 pairs (TRL's layout: 2B rows) | 2 | 54 | 108 | 70 | 35.2% | 36 |"
    # Packed: P + C + R = 20, 27, 5; bfd at 32 puts 27 + 5 in one row and 20 in another: 64 slots, 52 real.
    assert lines[3] == "| prefix-shared packed, bfd, rows of S = 32 | 2 | 32 | 64 | 52 | 18.8% | 21 |"
    assert "packed computes 1.69× fewer tokens than padded" in lines[5]
