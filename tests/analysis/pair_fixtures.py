"""Hand-made preference and unpaired outputs (DST folders) for the pair stats and report tests.

Each pair is given by its part lengths; ids are filler bytes (the queries count, never decode), so
every figure of the queries can be worked out by hand from the tables below (test_pair_stats.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from etl import columns as C
from tests.analysis.stats_fixtures import manifest as sft_manifest
from tests.helpers import seal

SEQ_LEN = 64


@dataclass
class Pair:
    id: str
    split: str
    prompt: int  # tokens of each part
    chosen: int
    rejected: int
    score_chosen: float | None = None
    score_rejected: float | None = None
    turns: int = 2
    turns_dropped: int = 0
    truncated: bool = False
    untrained_chosen: int = 0  # chosen tokens with mask False (a tool result inside the completion)
    part: int = 0


@dataclass
class Unpaired:
    id: str
    split: str
    prompt: int
    completion: int
    label: bool
    turns_dropped: int = 0
    truncated: bool = False


# fmt: off
PAIRS = [
    Pair("p1", "train", 10, 6, 4, 8.0, 2.5),
    Pair("p2", "train", 20, 3, 3, 9.0, 9.0, turns=4),                   # tie in score, equal length
    Pair("p3", "train", 5, 2, 9),                                       # no scores
    Pair("p4", "train", 30, 12, 1, 1.0, 3.0, turns=6, turns_dropped=2, truncated=True,
         untrained_chosen=2),
    Pair("p5", "train", 8, 40, 25, 5.0, None, part=1),                  # 73 > S: over shared S
    Pair("p6", "val", 4, 7, 7, 0.5, 0.5),                               # tie, equal length
    Pair("p7", "val", 12, 1, 5, 3.0, 1.0, turns=4, turns_dropped=1, truncated=True),
]
PAIR_COUNTS = {
    "read": 11, "written": 7, "truncated": 2, "dropped": {"pair_too_long": 2},
    "rejected": {"chosen_equals_rejected": 1, "empty_completion": 1},
}
UNPAIRED = [
    Unpaired("u1", "train", 10, 5, True),
    Unpaired("u2", "train", 10, 9, False),
    Unpaired("u3", "train", 6, 2, False, turns_dropped=1, truncated=True),
    Unpaired("u4", "val", 3, 12, True),
]
UNPAIRED_COUNTS = {"read": 5, "written": 4, "truncated": 1, "dropped": {},
                   "rejected": {"label_not_bool": 1}}
REJECTS = [
    {"source_file": "pairs.jsonl", "source_line": 5, "reason": "chosen_equals_rejected",
     "detail": "chosen equals rejected", "raw": "{}"},
    {"source_file": "pairs.jsonl", "source_line": 6, "reason": "empty_completion",
     "detail": "chosen is empty", "raw": "{}"},
]
UNPAIRED_REJECTS = [{"source_file": "kto.jsonl", "source_line": 3, "reason": "label_not_bool",
                     "detail": "label 'yes'", "raw": "{}"}]

COMMON = [
    (C.ID, pa.string()), (C.SOURCE_FILE, pa.string()), (C.SOURCE_LINE, pa.int64()),
    (C.DOMAIN, pa.string()), (C.SPLIT, pa.string()), (C.PROMPT_IDS, pa.list_(pa.int32())),
]
TAIL = [(C.NUM_TURNS, pa.int32()), (C.NUM_TURNS_DROPPED, pa.int32()), (C.TRUNCATED, pa.bool_())]
PAIR_SCHEMA = pa.schema([
    *COMMON, (C.CHOSEN_IDS, pa.list_(pa.int32())), (C.REJECTED_IDS, pa.list_(pa.int32())),
    (C.CHOSEN_MASK, pa.list_(pa.bool_())), (C.REJECTED_MASK, pa.list_(pa.bool_())),
    (C.NUM_PROMPT_TOKENS, pa.int32()), (C.NUM_CHOSEN_TOKENS, pa.int32()),
    (C.NUM_REJECTED_TOKENS, pa.int32()), (C.NUM_TOKENS, pa.int32()),
    (C.SCORE_CHOSEN, pa.float64()), (C.SCORE_REJECTED, pa.float64()), *TAIL,
])
UNPAIRED_SCHEMA = pa.schema([
    *COMMON, (C.COMPLETION_IDS, pa.list_(pa.int32())), (C.COMPLETION_MASK, pa.list_(pa.bool_())),
    (C.NUM_PROMPT_TOKENS, pa.int32()), (C.NUM_COMPLETION_TOKENS, pa.int32()),
    (C.NUM_TOKENS, pa.int32()), (C.LABEL, pa.bool_()), *TAIL,
])
# fmt: on


def _ids(n: int, start: int) -> list[int]:
    return [(start + i) % 256 for i in range(n)]


def _head(row_id: str, split: str, prompt: int, line: int) -> dict[str, Any]:
    return {
        C.ID: row_id,
        C.SOURCE_FILE: "pairs.jsonl",
        C.SOURCE_LINE: line,
        C.DOMAIN: "__default__",
        C.SPLIT: split,
        C.PROMPT_IDS: _ids(prompt, 97),
    }


def pair_row(p: Pair, line: int) -> dict[str, Any]:
    """One `data` row of a preference output, in the contract's columns."""
    return {
        **_head(p.id, p.split, p.prompt, line),
        C.CHOSEN_IDS: _ids(p.chosen, 65),
        C.REJECTED_IDS: _ids(p.rejected, 48),
        C.CHOSEN_MASK: [i >= p.untrained_chosen for i in range(p.chosen)],
        C.REJECTED_MASK: [True] * p.rejected,
        C.NUM_PROMPT_TOKENS: p.prompt,
        C.NUM_CHOSEN_TOKENS: p.chosen,
        C.NUM_REJECTED_TOKENS: p.rejected,
        C.NUM_TOKENS: p.prompt + p.chosen + p.rejected,
        C.SCORE_CHOSEN: p.score_chosen,
        C.SCORE_REJECTED: p.score_rejected,
        C.NUM_TURNS: p.turns,
        C.NUM_TURNS_DROPPED: p.turns_dropped,
        C.TRUNCATED: p.truncated,
    }


def unpaired_row(u: Unpaired, line: int) -> dict[str, Any]:
    """One `data` row of an unpaired (KTO) output."""
    return {
        **_head(u.id, u.split, u.prompt, line),
        C.COMPLETION_IDS: _ids(u.completion, 65),
        C.COMPLETION_MASK: [True] * u.completion,
        C.NUM_PROMPT_TOKENS: u.prompt,
        C.NUM_COMPLETION_TOKENS: u.completion,
        C.NUM_TOKENS: u.prompt + u.completion,
        C.LABEL: u.label,
        C.NUM_TURNS: 2 + u.turns_dropped,
        C.NUM_TURNS_DROPPED: u.turns_dropped,
        C.TRUNCATED: u.truncated,
    }


def write_pair_dst(
    root: Path,
    kind: str,
    items: list[Any],
    counts: dict[str, Any],
    rejects: list[dict[str, Any]] | None,
) -> Path:
    """A sealed DST of `kind` ("preference" or "unpaired"): data parts per (split, part), no turns/."""
    to_row, schema = (
        (pair_row, PAIR_SCHEMA) if kind == "preference" else (unpaired_row, UNPAIRED_SCHEMA)
    )
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for line, item in enumerate(items):
        groups.setdefault((item.split, getattr(item, "part", 0)), []).append(to_row(item, line))
    for (split, part), rows in sorted(groups.items()):
        (root / C.DATA_DIR / split).mkdir(parents=True, exist_ok=True)
        pq.write_table(
            pa.Table.from_pylist(rows, schema),
            root / C.DATA_DIR / split / f"part-{part:05d}.parquet",
        )
    if rejects:
        (root / C.REJECTS_DIR).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rejects), root / C.REJECTS_DIR / "part-00000.parquet")
    base = sft_manifest(counts)
    splits = {s: sum(1 for i in items if i.split == s) for s in sorted({i.split for i in items})}
    extra: dict[str, Any] = {
        "seq_len": SEQ_LEN,
        "splits": splits,
        C.MANIFEST_KIND: kind,
        "config": {"truncation": "drop_oldest_turns", "seq_len": SEQ_LEN},
    }
    if kind == "preference":
        over = sum(p.prompt + p.chosen + p.rejected > SEQ_LEN for p in items)
        extra["preference"] = {"fit": "separate", "over_shared_seq_len": over}
    return seal(root, {**base, **extra})
