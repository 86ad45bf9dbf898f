"""sequential (seed 003): the documents as one stream cut into windows of exactly S tokens."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.packing.sequential import sequential


def test_windows_by_hand():
    # S=8 over 5+4+3+3+2+1 = 18 tokens: windows [0, 8), [8, 16), [16, 18).
    # Doc 1 (stream 5..9) is cut after 3 tokens; doc 4 (stream 15..17) after 1.
    p = sequential(np.array([5, 4, 3, 3, 2, 1]), seq_len=8)
    assert p.num_packs == 3
    assert p.doc.tolist() == [0, 1, 1, 2, 3, 4, 4, 5]
    assert p.start.tolist() == [0, 0, 3, 0, 0, 0, 1, 0]
    assert p.length.tolist() == [5, 3, 1, 3, 3, 1, 1, 1]
    assert p.pack.tolist() == [0, 0, 1, 1, 1, 1, 2, 2]
    assert p.pack_tokens().tolist() == [8, 8, 2]  # the short last window is kept


def test_a_long_document_spans_windows_and_full_windows_end_exactly():
    p = sequential(np.array([20]), seq_len=8)
    assert (p.start.tolist(), p.length.tolist(), p.pack.tolist()) == ([0, 8, 16], [8, 8, 4], [0, 1, 2])
    q = sequential(np.array([8, 8]), seq_len=8)
    assert (q.doc.tolist(), q.pack.tolist(), q.num_packs) == ([0, 1], [0, 1], 2)


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(1, 50), max_size=60), seq_len=st.integers(1, 40))
def test_pieces_in_order_rebuild_the_stream(lengths, seq_len):
    p = sequential(np.array(lengths, dtype=np.int64), seq_len=seq_len)
    stream = [(d, t) for d, n in enumerate(lengths) for t in range(n)]
    rebuilt = [(d, s + t) for d, s, n in zip(p.doc, p.start, p.length) for t in range(n)]
    assert rebuilt == stream
    assert (p.length >= 1).all() and (np.diff(p.pack) >= 0).all()
    tokens = p.pack_tokens()
    assert len(tokens) == p.num_packs == -(-sum(lengths) // seq_len)
    assert (tokens[:-1] == seq_len).all()
    assert len(tokens) == 0 or 1 <= tokens[-1] <= seq_len
    # A window holds at most one piece of a document: no document is cut twice in one window.
    assert len(set(zip(p.doc.tolist(), p.pack.tolist()))) == len(p)
