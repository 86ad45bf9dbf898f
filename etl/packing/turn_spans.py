"""`TurnSpans`: the kept turns of a split as arrays (example row, token range, role, header length).

Stream packing with boundary injection needs where each system/user/assistant span lies in its
example; the `turns` table has it by example `id`. This maps ids to data rows with one hash lookup
(`pc.index_in`; shuffled rows cost a lexsort more: docs/design.md, Measured costs), and keeps
only numpy arrays: 1M turns cost ~33 MB.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.columns import END, ID, KEPT, NUM_TOKENS, ROLE, START, TURN_INDEX
from etl.errors import EtlError

# Role codes of `TurnSpans.role` (int8); every role not named here (tool, text, ...) is OTHER.
ROLE_OTHER, ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT = 0, 1, 2, 3
ROLE_CODES: dict[str, int] = {"system": ROLE_SYSTEM, "user": ROLE_USER, "assistant": ROLE_ASSISTANT}


@dataclass(frozen=True)
class TurnSpans:
    """Turn m is tokens ``[start[m], end[m])`` of example ``doc[m]``; sorted by doc, then start.

    Attributes:
        doc: (M,) int64 example of each turn (its row in the split's data, in row order).
        start: (M,) int64 first token of the turn in its example.
        end: (M,) int64 one past its last token.
        role: (M,) int8 `ROLE_*` code.
        header_len: (M,) int64 tokens of the role header at the turn's start (``<|USER|>``: 1,
            ChatML ``<|im_start|>user\\n``: 3); 0 when the header was cut away (left truncation).
    """

    doc: np.ndarray
    start: np.ndarray
    end: np.ndarray
    role: np.ndarray
    header_len: np.ndarray

    def __len__(self) -> int:
        return int(self.doc.shape[0])

    def take_docs(self, docs: np.ndarray) -> TurnSpans:
        """The turns of examples ``docs`` in that order, renumbered ``0..len(docs)-1``; the turns
        of other examples are left out (a shuffled epoch, a filtered dataset). One lexsort."""
        docs = np.asarray(docs, dtype=np.int64)
        where = np.full(int(max(self.doc.max(initial=-1), docs.max(initial=-1))) + 1, -1, dtype=np.int64)
        where[docs] = np.arange(len(docs), dtype=np.int64)
        new = where[self.doc]
        keep = np.flatnonzero(new >= 0)
        order = keep[np.lexsort((self.start[keep], new[keep]))]
        return TurnSpans(new[order], self.start[order], self.end[order], self.role[order],
                         self.header_len[order])


def header_lengths(manifest: Mapping[str, Any]) -> dict[str, int]:
    """Tokens of each role's header from a manifest's ``template.roles.<role>.header_ids``.

    Raises:
        EtlError: when the manifest has no template roles (written by an older etl: re-run
            ``etl run`` to get one).
    """
    roles = (manifest.get("template") or {}).get("roles")
    if not isinstance(roles, Mapping) or not roles:
        raise EtlError(
            "the manifest has no `template.roles` (header ids per role), which stream packing needs; "
            "re-run `etl run` with this etl to write it"
        )
    return {str(name): len(spec.get("header_ids") or []) for name, spec in roles.items()}


def _codes(values: pa.Array, names: list[str], table: np.ndarray, default: int) -> np.ndarray:
    """``table[i]`` where ``values`` equals ``names[i]``, else ``default``: one hash lookup."""
    where = pc.index_in(values, value_set=pa.array(names, type=values.type))
    index = where.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return np.where(index >= 0, np.append(table, default)[index], default)


def _left_cut(doc: np.ndarray, start: np.ndarray, end: np.ndarray, full: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Turns whose first tokens (their header) were cut away by a left truncation.

    Only the first kept turn of an example can lose tokens on the left; a right cut (policies
    `right`, `keep_prefix`) leaves the last kept turn short instead. A short first turn is left-cut
    when turns before it were dropped or turns after it were kept. Arrays sorted by doc, start.
    """
    n = len(doc)
    first = np.ones(n, dtype=bool)
    first[1:] = doc[1:] != doc[:-1]
    last = np.ones(n, dtype=bool)
    last[:-1] = doc[1:] != doc[:-1]
    return (end - start < full) & first & ((index > 0) | ~last)


def _rows(turn_ids: pa.Array, ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """(M,) int64 row of each turn's id in ``ids``: one hash lookup, no loop per row."""
    ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    if len(ids) and pc.count_distinct(ids).as_py() != len(ids):
        raise EtlError("the data ids repeat an id; pass one split's `id` column of one `etl run`")
    rows = pc.index_in(turn_ids, value_set=ids.cast(turn_ids.type))
    if rows.null_count:
        unknown = pc.filter(turn_ids, pc.is_null(rows))[0].as_py()
        raise EtlError(
            f"{rows.null_count} kept turns have ids not in the data (e.g. {unknown!r}); "
            "pass the turns and data of the same split of one `etl run`"
        )
    return rows.to_numpy(zero_copy_only=False).astype(np.int64)


def turn_spans(turns: pa.Table, ids: pa.Array | pa.ChunkedArray, *, header_len: Mapping[str, int]) -> TurnSpans:
    """The kept turns of ``turns`` as `TurnSpans`, examples numbered by their row in ``ids``.

    Args:
        turns: the split's `turns` table (``id``, ``turn_index``, ``role``, ``start``, ``end``,
            ``num_tokens``, ``kept``); turns with ``kept`` False are not in the tokens and dropped.
        ids: the split's data ``id`` column in row order (what the packer's lengths follow).
        header_len: header tokens per role name (`header_lengths` of the manifest); 0 for others.

    Returns:
        Kept turns sorted by example row, then start.

    Raises:
        EtlError: when a turn's id is not in ``ids`` or ``ids`` repeats an id (turns and data
            from different runs or splits: pass the same split's tables).
    """
    missing = {ID, TURN_INDEX, ROLE, START, END, NUM_TOKENS, KEPT} - set(turns.column_names)
    if missing:
        raise EtlError(f"the turns table lacks columns {sorted(missing)}; pass DST/turns/<split> of `etl run`")
    kept = turns.filter(pc.and_kleene(pc.field(KEPT), pc.greater_equal(pc.field(START), 0)))

    def column(name: str) -> np.ndarray:
        return kept.column(name).to_numpy().astype(np.int64)

    doc, start, end = _rows(kept.column(ID).combine_chunks(), ids), column(START), column(END)
    # `etl run` writes turns in data order, so the sort is usually a no-op: check in O(M) first.
    roles, full, index = kept.column(ROLE).combine_chunks(), column(NUM_TOKENS), column(TURN_INDEX)
    if not ((np.diff(doc) > 0) | ((np.diff(doc) == 0) & (np.diff(start) >= 0))).all():
        order = np.lexsort((start, doc))
        doc, start, end, full, index = doc[order], start[order], end[order], full[order], index[order]
        roles = roles.take(pa.array(order))
    names = list(header_len)
    headers = _codes(roles, names, np.array([header_len[r] for r in names], dtype=np.int64), 0)
    cut = _left_cut(doc, start, end, full, index)
    role_names = list(ROLE_CODES)
    return TurnSpans(
        doc=doc,
        start=start,
        end=end,
        role=_codes(roles, role_names, np.array(list(ROLE_CODES.values())), ROLE_OTHER).astype(np.int8),
        header_len=np.where(cut, 0, headers).astype(np.int64),
    )
