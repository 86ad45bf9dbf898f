"""`turn_spans`: kept turns of the `turns` table as arrays numbered by data row; `header_lengths`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from etl.cli import main
from etl.errors import EtlError
from etl.packing.turn_spans import (
    ROLE_ASSISTANT,
    ROLE_OTHER,
    ROLE_SYSTEM,
    ROLE_USER,
    header_lengths,
    turn_spans,
)

RAW = Path(__file__).resolve().parents[2] / "examples" / "raw"
SYS, USR, AST, END, EOS = 256, 257, 258, 259, 260  # post_training's special ids
HEADERS = {"system": 1, "user": 1, "assistant": 1, "text": 0}


def turns_table(rows: list[tuple[str, int, str, int, int, int, bool]]) -> pa.Table:
    """A `turns` table from (id, turn_index, role, start, end, num_tokens, kept) rows."""
    cols = list(zip(*rows, strict=True))
    return pa.table({
        "id": pa.array(cols[0], pa.string()),
        "turn_index": pa.array(cols[1], pa.int32()),
        "role": pa.array(cols[2], pa.string()),
        "start": pa.array(cols[3], pa.int32()),
        "end": pa.array(cols[4], pa.int32()),
        "num_tokens": pa.array(cols[5], pa.int32()),
        "trained": pa.array([r[2] == "assistant" for r in rows]),
        "kept": pa.array(cols[6]),
        "injected": pa.array([False] * len(rows)),
    })


def test_hand_made_table_maps_ids_to_rows_drops_unkept_and_zeroes_cut_headers() -> None:
    table = turns_table([
        # b: system kept, first pair dropped (start -1), a tool turn, last pair kept.
        ("b", 0, "system", 0, 4, 4, True),
        ("b", 1, "user", -1, -1, 5, False),
        ("b", 2, "assistant", -1, -1, 6, False),
        ("b", 3, "user", 4, 9, 5, True),
        ("b", 4, "tool", 12, 15, 3, True),  # listed out of order: sorted by start
        ("b", 5, "assistant", 9, 12, 3, True),
        # a: left truncation cut the system away and the user's first 3 tokens (its header).
        ("a", 0, "system", -1, -1, 6, False),
        ("a", 1, "user", 0, 4, 7, True),
        ("a", 2, "assistant", 4, 10, 6, True),
        # c: one assistant turn left-cut (turn 0, nothing after it is kept... it is the last).
        ("c", 0, "user", 0, 3, 3, True),
        ("c", 1, "assistant", 3, 6, 9, True),  # right cut: the last kept turn is short
    ])
    spans = turn_spans(table, pa.chunked_array([["c"], ["a", "b"]]), header_len={"user": 3, "assistant": 2})
    np.testing.assert_array_equal(spans.doc, [0, 0, 1, 1, 2, 2, 2, 2])
    np.testing.assert_array_equal(spans.start, [0, 3, 0, 4, 0, 4, 9, 12])
    np.testing.assert_array_equal(spans.end, [3, 6, 4, 10, 4, 9, 12, 15])
    S, U, A, O = ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_OTHER
    np.testing.assert_array_equal(spans.role, [U, A, U, A, S, U, A, O])
    # system absent from the mapping -> 0; a's cut user lost its header -> 0; c's short
    # assistant is the last kept turn (a right cut) so its header is still there.
    np.testing.assert_array_equal(spans.header_len, [3, 2, 0, 2, 0, 3, 2, 0])
    assert spans.role.dtype == np.int8 and spans.doc.dtype == np.int64 and len(spans) == 8


def test_unknown_id_repeated_ids_and_missing_columns_are_errors() -> None:
    table = turns_table([("a", 0, "user", 0, 3, 3, True), ("z", 0, "user", 0, 3, 3, True)])
    with pytest.raises(EtlError, match="not in the data.*'z'"):
        turn_spans(table, pa.array(["a", "b"]), header_len=HEADERS)
    with pytest.raises(EtlError, match="repeat"):
        turn_spans(table, pa.array(["a", "z", "a"]), header_len=HEADERS)
    with pytest.raises(EtlError, match="lacks columns.*kept"):
        turn_spans(table.drop_columns(["kept"]), pa.array(["a", "z"]), header_len=HEADERS)


def test_header_lengths_reads_the_template_roles() -> None:
    manifest = {"template": {"roles": {
        "user": {"header_ids": [151644, 872, 198]}, "assistant": {"header_ids": [151644, 77091, 198]},
        "text": {"header_ids": []},
    }}}
    assert header_lengths(manifest) == {"user": 3, "assistant": 3, "text": 0}
    with pytest.raises(EtlError, match="re-run `etl run`"):
        header_lengths({"template": {}})


@pytest.fixture(scope="module")
def truncated_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/raw through `etl run --template post_training --seq-len 100`: pairs dropped,
    turns left-cut (kept=False rows, a user without its header)."""
    dst = tmp_path_factory.mktemp("pt") / "dst"
    assert main(["run", str(RAW), str(dst), "--template", "post_training", "--seq-len", "100"]) == 0
    return dst


def test_post_training_run_spans_match_the_tokens(truncated_run: Path) -> None:
    manifest = json.loads((truncated_run / "_manifest.json").read_text())
    assert header_lengths(manifest) == HEADERS
    data = ds.dataset(truncated_run / "data" / "train").to_table(columns=["id", "input_ids"])
    turns = ds.dataset(truncated_run / "turns" / "train").to_table()
    spans = turn_spans(turns, data.column("id"), header_len=header_lengths(manifest))
    assert len(spans) == sum(turns.column("kept").to_pylist())
    tokens = data.column("input_ids").to_pylist()
    header = {ROLE_SYSTEM: SYS, ROLE_USER: USR, ROLE_ASSISTANT: AST}
    seen_cut = 0
    for d, s, e, r, h in zip(spans.doc, spans.start, spans.end, spans.role, spans.header_len, strict=True):
        ids = tokens[d]
        assert 0 <= s < e <= len(ids) and ids[e - 1] == END  # every kept turn ends with <|END|>
        if h:
            assert ids[s] == header[r]
        else:  # left-cut: the header token is gone from the example
            seen_cut += 1
            assert header[r] not in ids[s:e]
    assert seen_cut == 5  # chats 3, 4, 7 (users) and 5, 10 (assistants) at --seq-len 100
    # Rows follow the data order: example row d's id is the id of its turns.
    id_of_turns = turns.filter(turns.column("kept")).column("id").to_pylist()
    assert sorted(data.column("id").to_pylist()[d] for d in spans.doc) == sorted(id_of_turns)
