"""Hand-made etl outputs (DST folders) for the stats, report, inspect and notebook tests.

Examples are built from readable turns with the `bytes` tokenizer (ids 0..255 = UTF-8 bytes,
specials from 256), written with pyarrow in the contract layout, so every figure is known.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tests.helpers import seal

SPECIAL = {"<|sys|>": 256, "<|usr|>": 257, "<|asst|>": 258, "<|eot|>": 259}
HEADER = {"system": 256, "user": 257, "assistant": 258}
EOT = 259
SEP = [10]  # "\n" after every end-of-turn, for every role
SEQ_LEN = 128
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Turn:
    """One message: dropped turns keep their would-be length but get no offsets."""

    role: str
    text: str
    kept: bool = True
    trained: bool | None = None  # None: trained iff assistant
    eot_trained: bool = True
    header_trained: bool = False  # seed 001 trains the assistant header marker too
    sep: bool = True  # False: no separator after the end-of-turn (e.g. the conversation's last)


@dataclass
class Example:
    id: str
    split: str
    domain: str
    turns: list[Turn]
    part: int = 0
    source_line: int = 0
    truncated: bool = False
    source_file: str | None = None  # None: "raw/<domain>.jsonl"; a mixture's is "<source>/<file>"


def _serialize(example: Example) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    ids: list[int] = []
    mask: list[bool] = []
    turn_rows = []
    for index, turn in enumerate(example.turns):
        content = list(turn.text.encode("utf-8"))
        trained = turn.role == "assistant" if turn.trained is None else turn.trained
        sep = SEP if turn.sep else []
        pieces = [HEADER[turn.role], *content, EOT, *sep]
        if not turn.kept:
            turn_rows.append(
                {
                    "turn_index": index,
                    "role": turn.role,
                    "start": -1,
                    "end": -1,
                    "num_tokens": len(pieces),
                    "trained": trained,
                    "kept": False,
                }
            )
            continue
        start = len(ids)
        ids += pieces
        mask += [
            trained and turn.header_trained,
            *[trained] * len(content),
            trained and turn.eot_trained,
            *[False] * len(sep),
        ]
        turn_rows.append(
            {
                "turn_index": index,
                "role": turn.role,
                "start": start,
                "end": len(ids),
                "num_tokens": len(pieces),
                "trained": trained,
                "kept": True,
            }
        )
    row = {
        "id": example.id,
        "source_file": example.source_file or f"raw/{example.domain}.jsonl",
        "source_line": example.source_line,
        "domain": example.domain,
        "split": example.split,
        "input_ids": ids,
        "loss_mask": mask,
        "num_tokens": len(ids),
        "num_trained": sum(mask),
        "num_turns": len(example.turns),  # every turn, dropped ones included (as etl run writes)
        "num_turns_dropped": sum(not t.kept for t in example.turns),
        "truncated": example.truncated,
    }
    return row, [dict(id=example.id, **t) for t in turn_rows]


# fmt: off
SYS = Turn("system", "you are a helpful assistant.")

EXAMPLES = [
    Example("ex-math-1", "train", "math",
            [SYS, Turn("user", "what is 2+2?"), Turn("assistant", "4.")]),
    Example("ex-code-1", "train", "code", [
        Turn("system", "be terse."), Turn("user", "print hi"), Turn("assistant", "print('hi')"),
        Turn("user", "and bye?"), Turn("assistant", "print('bye')", header_trained=True)],
        source_line=1),
    Example("ex-math-2", "train", "math", [
        SYS, Turn("user", "an old question", kept=False),
        Turn("assistant", "an old answer", kept=False),
        Turn("user", "new q"), Turn("assistant", "new a")], source_line=2, truncated=True),
    Example("ex-chat-1", "train", "__default__", [
        SYS, Turn("user", "hello"),
        Turn("assistant", "hi there! how can i help you today?", eot_trained=False)], part=1),
    Example("ex-code-2", "train", "code", [
        SYS, Turn("user", "only the user speaks"), Turn("assistant", "not trained", trained=False)],
        part=1, source_line=3),
    Example("ex-chat-2", "train", "__default__", [
        SYS, Turn("user", "tell me a long story about parquet files and duckdb"),
        Turn("assistant", "once upon a time, a row group")],  # <= SEQ_LEN
        part=1, source_line=4),
    Example("ex-math-3", "val", "math",
            [SYS, Turn("user", "1+1"), Turn("assistant", "2", sep=False)]),
    Example("ex-code-3", "val", "code", [
        SYS, Turn("user", "unicode?"), Turn("assistant", "ünï", trained=False),
        Turn("user", "again"), Turn("assistant", "cödé ✓")], source_line=5),
]

REJECT_COLUMNS = ("source_file", "source_line", "reason", "detail", "raw")
REJECTS = [dict(zip(REJECT_COLUMNS, row)) for row in [
    ("raw/math.jsonl", 7, "invalid_json", "line 1: bad", "{"),
    ("raw/code.jsonl", 9, "invalid_json", "line 1: eof", "[1"),
    ("raw/code.jsonl", 2, "missing_messages", "no messages", "{}"),
    # In the file but not in the manifest counts (and the manifest's bad_role has no row): the
    # drops query must show both sides of such a mismatch.
    ("raw/math.jsonl", 11, "encoding", "not utf-8", "?"),
]]

COUNTS = {
    "read": 15, "written": 8, "truncated": 1,
    "dropped": {"too_long": 1, "no_trained_tokens": 2},
    "rejected": {"invalid_json": 2, "missing_messages": 1, "bad_role": 1},
}

DATA_SCHEMA = pa.schema([
    ("id", pa.string()), ("source_file", pa.string()), ("source_line", pa.int64()),
    ("domain", pa.string()), ("split", pa.string()), ("input_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.bool_())), ("num_tokens", pa.int32()), ("num_trained", pa.int32()),
    ("num_turns", pa.int32()), ("num_turns_dropped", pa.int32()), ("truncated", pa.bool_()),
])
TURNS_SCHEMA = pa.schema([
    ("id", pa.string()), ("turn_index", pa.int32()), ("role", pa.string()), ("start", pa.int32()),
    ("end", pa.int32()), ("num_tokens", pa.int32()), ("trained", pa.bool_()), ("kept", pa.bool_()),
])
# fmt: on


def manifest(counts: dict[str, Any]) -> dict[str, Any]:
    roles = {r: {"header_ids": [h], "end_ids": [EOT], "sep_ids": SEP} for r, h in HEADER.items()}
    return {
        "seq_len": SEQ_LEN,
        "pad_id": EOT,
        "eot_id": EOT,
        "tokenizer": {"name": "bytes", "path": None, "sha256": None, "vocab_size": 260},
        "template": {"name": "fixture", "roles": roles},
        "special_ids": SPECIAL,
        "counts": counts,
        "splits": {"train": 6, "val": 2},
    }


def write_dst(
    root: Path,
    examples: list[Example],
    *,
    counts: dict[str, Any],
    rejects: list[dict[str, Any]] | None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write examples in the DESIGN §4 layout (one part file per (split, part)); `extra` adds
    top-level manifest keys (e.g. `mixture`)."""
    groups: dict[tuple[str, int], list[Example]] = {}
    for ex in examples:
        groups.setdefault((ex.split, ex.part), []).append(ex)
    for (split, part), group in sorted(groups.items()):
        rows, turns = zip(*(_serialize(ex) for ex in group))
        for folder, table in (
            ("data", pa.Table.from_pylist(list(rows), DATA_SCHEMA)),
            ("turns", pa.Table.from_pylist([t for ts in turns for t in ts], TURNS_SCHEMA)),
        ):
            (root / folder / split).mkdir(parents=True, exist_ok=True)
            pq.write_table(table, root / folder / split / f"part-{part:05d}.parquet")
    if rejects is not None:
        (root / "_rejects").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rejects), root / "_rejects" / "part-00000.parquet")
    return seal(root, {**manifest(counts), **(extra or {})})


def etl_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m etl ARGS` in a subprocess (what a user's shell does)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "etl", *args],
        capture_output=True,
        text=True,
        check=False,
        env=full_env,
        timeout=120,
    )


def write_raw_chats(path: Path, *, n: int = 60, seed: int = 0) -> Path:
    """Raw JSONL for `etl run`: n chats of 1-4 exchanges, then one bad line and one empty chat."""
    rng = random.Random(seed)
    words = [
        "the",
        "a",
        "data",
        "token",
        "parquet",
        "column",
        "row",
        "model",
        "loss",
        "mask",
        "turn",
        "why",
        "how",
        "long",
        "short",
    ]

    def text(k: int) -> str:
        return " ".join(rng.choice(words) for _ in range(k))

    lines = []
    for i in range(n):
        messages = [{"role": "system", "content": "be brief. " + text(3)}] if i % 3 == 0 else []
        for _ in range(rng.randint(1, 4)):
            messages.append({"role": "user", "content": text(rng.randint(2, 30))})
            messages.append({"role": "assistant", "content": text(rng.randint(1, 60))})
        lines.append(json.dumps({"messages": messages}))
    lines += ["{not json", json.dumps({"messages": []})]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
