"""`etl inspect` of a preference pair or an unpaired completion: the row shown as one example.

A pair is laid out as the prefix-shared packed layout holds it, `[prompt, chosen, rejected]`,
with a marker line where each part starts (the rejected part follows the prompt, not the chosen
part); an unpaired row as `[prompt, completion]`. The completion masks are the trained tokens.
"""

from __future__ import annotations

from typing import Any

from etl import columns as C
from etl.kinds import KINDS

# A part's name on its marker line where it is more than its ids column less `_ids`.
_MARKERS = {C.REJECTED_IDS: "rejected (follows the prompt, not chosen)"}


def as_example(row: dict[str, Any], kind: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The row as `etl inspect` shows an SFT example (`input_ids`, `loss_mask`), and one turn per part."""
    ids, mask = list(row[C.PROMPT_IDS]), [False] * len(row[C.PROMPT_IDS])
    turns = [_part(0, "prompt", 0, len(ids), trained=False)]
    for ids_col, mask_col in KINDS[kind].parts[1:]:  # after the prompt
        name = _MARKERS.get(ids_col, ids_col.removesuffix("_ids"))
        turns.append(_part(len(turns), name, len(ids), len(ids) + len(row[ids_col]), trained=any(row[mask_col])))
        ids += row[ids_col]
        mask += row[mask_col]
    label = f" (label {'desirable' if row[C.LABEL] else 'undesirable'})" if KINDS[kind].label else ""
    turns[-1][C.ROLE] += label
    return {**row, C.INPUT_IDS: ids, C.LOSS_MASK: mask, C.NUM_TOKENS: len(ids), C.NUM_TURNS: len(turns)}, turns


def _part(index: int, name: str, start: int, end: int, *, trained: bool) -> dict[str, Any]:
    return {C.TURN_INDEX: index, C.ROLE: name, C.START: start, C.END: end, C.KEPT: True, C.TRAINED: trained,
            C.NUM_TOKENS: end - start}
