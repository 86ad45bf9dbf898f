"""bfd / ffd: hand-worked packings, and the vectorized packers against a per-item loop."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.errors import EtlError
from etl.packing import bins
from etl.packing.bins import bfd, ffd
from etl.packing.registry import PACKERS, pack


def reference(
    lengths: list[int], seq_len: int, *, best: bool, max_docs: int | None = None, window: int | None = None
) -> tuple[list[int], int]:
    """Plain per-item BFD / FFD over a list of bins: the textbook definition, slow and obvious.

    Longest first (ties: lower index first); best fit takes the fitting bin with the least room
    (ties: oldest), first fit the oldest fitting bin; no fit opens a bin. Windows of ``window``
    consecutive documents are packed one after the other with fresh bins.
    """
    clipped = [min(n, seq_len) for n in lengths]
    out = [0] * len(clipped)
    total = 0
    step = window or max(len(clipped), 1)
    for lo in range(0, len(clipped), step):
        room: list[int] = []
        docs: list[int] = []
        for i in sorted(range(lo, min(lo + step, len(clipped))), key=lambda i: -clipped[i]):
            fits = [b for b in range(len(room)) if room[b] >= clipped[i] and (max_docs is None or docs[b] < max_docs)]
            if not fits:
                room.append(seq_len)
                docs.append(0)
                fits = [len(room) - 1]
            b = min(fits, key=lambda k: (room[k], k)) if best else fits[0]
            room[b] -= clipped[i]
            docs[b] += 1
            out[i] = total + b
        total += len(room)
    return out, total


def assignment(packing) -> list[int]:
    """Bin of every example, by example index."""
    out = np.empty(len(packing), dtype=np.int64)
    out[packing.doc] = packing.pack
    return out.tolist()


def test_bfd_and_ffd_by_hand():
    # S=8, longest first: 5 -> bin0 (room 3); 4 -> bin1 (4); 3 -> bin0 (fullest that fits, and
    # oldest): room 0; 3 -> bin1 (1); 2 -> fits nowhere, bin2 (6); 1 -> bin1 (room 1 is least).
    # First fit gives the same bins here: the 1 goes to bin1, the oldest with room.
    lengths = np.array([5, 4, 3, 3, 2, 1])
    for fn in (bfd, ffd):
        p = fn(lengths, seq_len=8)
        assert p.num_packs == 3
        assert p.doc.tolist() == [0, 2, 1, 3, 5, 4]  # by pack, then by example index
        assert p.pack.tolist() == [0, 0, 1, 1, 1, 2]
        assert p.length.tolist() == [5, 3, 4, 3, 1, 2]
        assert p.start.tolist() == [0] * 6
        assert p.pack_tokens().tolist() == [8, 8, 2]


def test_bfd_beats_ffd_by_hand():
    # S=15: 11 -> bin0 (room 4); 7 -> bin1 (8); 5 -> bin1 (3). Then the 3: best fit takes bin1
    # (room 3 < 4), leaving bin0's 4 for both 2s: 2 bins. First fit puts the 3 in bin0 (room 1),
    # one 2 in bin1 (room 1) and the last 2 opens bin2: 3 bins.
    lengths = [11, 7, 5, 3, 2, 2]
    assert assignment(bfd(np.array(lengths), seq_len=15)) == [0, 1, 1, 1, 0, 0]
    assert assignment(ffd(np.array(lengths), seq_len=15)) == [0, 1, 1, 0, 1, 2]


def test_max_docs_per_bin_by_hand():
    # At most 2 examples a bin, S=8: 5 -> bin0; 4 -> bin1; 3 -> bin0 (now 2 docs, closed);
    # 3 -> bin1 (closed); 2 -> bin2; 1 -> bin2 (room 6 -> 5), though bin1 still has 1 token free.
    p = bfd(np.array([5, 4, 3, 3, 2, 1]), seq_len=8, max_docs_per_bin=2)
    assert assignment(p) == [0, 1, 0, 1, 2, 2]
    assert assignment(ffd(np.array([5, 4, 3, 3, 2, 1]), seq_len=8, max_docs_per_bin=1)) == [0, 1, 2, 3, 4, 5]


def test_buffer_docs_windows_by_hand():
    # Windows of 3: [5, 4, 3] -> bins 0, 1, 0; then [3, 2, 1] packed alone -> one bin, numbered 2.
    p = bfd(np.array([5, 4, 3, 3, 2, 1]), seq_len=8, buffer_docs=3)
    assert assignment(p) == [0, 1, 0, 2, 2, 2]
    assert p.num_packs == 3


def test_long_examples_are_clipped_to_one_full_bin():
    p = ffd(np.array([3, 10, 8]), seq_len=8)
    assert p.num_packs == 3
    assert dict(zip(p.doc.tolist(), p.length.tolist())) == {0: 3, 1: 8, 2: 8}


@pytest.mark.parametrize("name", ["bfd", "ffd", "sequential"])
def test_empty_examples_are_rejected_and_empty_input_is_no_pack(name):
    with pytest.raises(EtlError, match="no tokens"):
        pack(name, np.array([3, 0, 2]), seq_len=8)
    with pytest.raises(EtlError, match="seq_len"):
        pack(name, np.array([3]), seq_len=0)
    assert pack(name, np.zeros(0, dtype=np.int64), seq_len=8).num_packs == 0


def test_bad_options_and_unknown_strategy():
    with pytest.raises(EtlError, match="buffer_docs"):
        bfd(np.array([3]), seq_len=8, buffer_docs=0)
    with pytest.raises(EtlError, match="max_docs_per_bin"):
        ffd(np.array([3]), seq_len=8, max_docs_per_bin=0)
    with pytest.raises(EtlError, match="'bfd', 'ffd', 'sequential'"):
        pack("best", np.array([3]), seq_len=8)
    with pytest.raises(EtlError, match=r"takes no option \['buffer_docs'\]; its options: \['seed'\]"):
        pack("sequential", np.array([3]), seq_len=8, buffer_docs=4)
    # Options reach the packer: windows [5, 4] | [3] need 3 bins, the whole input 2 (5+3, 4).
    assert pack("bfd", np.array([5, 4, 3]), seq_len=8, buffer_docs=2, seed=7).num_packs == 3
    assert pack("bfd", np.array([5, 4, 3]), seq_len=8, seed=7).num_packs == 2
    assert {"bfd", "ffd", "sequential"} <= set(PACKERS)


def check_whole(packing, lengths: np.ndarray, seq_len: int) -> None:
    """Each example is one piece of its clipped length; packs 0..n-1, none empty or over S."""
    assert sorted(packing.doc.tolist()) == list(range(len(lengths)))
    assert (packing.length[np.argsort(packing.doc)] == np.minimum(lengths, seq_len)).all()
    assert (packing.start == 0).all()
    assert (np.diff(packing.pack) >= 0).all()
    tokens = packing.pack_tokens()
    assert len(tokens) == packing.num_packs
    assert (tokens > 0).all() and (tokens <= seq_len).all()


cases = st.integers(1, 40).flatmap(
    lambda s: st.tuples(
        st.lists(st.integers(1, s + 10), max_size=80),
        st.just(s),
        st.none() | st.integers(1, 4),
        st.none() | st.integers(1, 30),
    )
)


@pytest.mark.parametrize("side_by_side", [True, False])
@settings(max_examples=150, deadline=None)
@given(case=cases)
def test_same_bins_as_the_per_item_loop(case, side_by_side):
    # Windows go through either path (side by side, or the run-by-run core per window): force each.
    lengths, seq_len, max_docs, window = case
    arr = np.array(lengths, dtype=np.int64)
    for fn, best in ((bfd, True), (ffd, False)):
        with mock.patch.object(bins, "side_by_side_cheaper", return_value=side_by_side):
            p = fn(arr, seq_len=seq_len, max_docs_per_bin=max_docs, buffer_docs=window)
        check_whole(p, arr, seq_len)
        expected, count = reference(lengths, seq_len, best=best, max_docs=max_docs, window=window)
        assert p.num_packs == count
        assert assignment(p) == expected  # the same bins, not only as many
        if max_docs is not None:
            assert (np.bincount(p.pack) <= max_docs).all()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), seq_len=st.sampled_from([64, 512, 2048]))
def test_many_equal_lengths_match_the_loop(seed, seq_len):
    # Large runs of equal lengths, where one bin takes many items of a run at once.
    rng = np.random.default_rng(seed)
    lengths = rng.choice(rng.integers(1, seq_len + 1, 12), size=600)
    expected, count = reference(lengths.tolist(), seq_len, best=True)
    p = bfd(lengths, seq_len=seq_len)
    assert p.num_packs == count and assignment(p) == expected
