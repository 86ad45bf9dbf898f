"""What a run counts as it goes: records read, written, dropped and rejected (which must add
up), tokens, the inputs it could not read to their end, and wall seconds per stage."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


def tally(counter: Counter[str], reasons: pa.Array | pa.ChunkedArray) -> None:
    """Add a column of reasons to a counter (value_counts in C, not a loop over rows)."""
    for item in pc.value_counts(reasons).to_pylist():
        counter[item["values"]] += item["counts"]


@dataclass
class Counts:
    """Accounting of one run: read == written + sum(dropped) + sum(rejected)."""

    read: int = 0
    written: int = 0
    truncated: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    repeated: int | None = None  # a mixture's extra copies of records (rows = written + repeated)
    over_shared: int = 0  # preference pairs written whose prompt + chosen + rejected exceeds S
    header_cut: int = 0  # examples written whose window cuts through a turn's header (a short S)
    # examples written whose messages spell a control token: tokenized as text, so their ids differ
    # from apply_chat_template's, which reads the token (etl.pipeline.joins.spells_control)
    special_text: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    # Records read per input file, for the warning that says how much of a damaged file was kept.
    read_per_file: Counter[str] = field(default_factory=Counter)
    # Inputs not read to their end (the manifest's `incomplete_inputs`).
    incomplete: list[dict[str, Any]] = field(default_factory=list)

    def add_up(self) -> bool:
        """Every record read is written, dropped with a reason or rejected with a reason."""
        return self.read == self.written + sum(self.dropped.values()) + sum(self.rejected.values())

    def add(self, other: Counts) -> None:
        """Add another part's counts (a mixture's source) to these."""
        self.read += other.read
        self.written += other.written
        self.truncated += other.truncated
        self.tokens += other.tokens
        self.trained_tokens += other.trained_tokens
        self.over_shared += other.over_shared
        self.header_cut += other.header_cut
        self.special_text += other.special_text
        if other.repeated is not None:
            self.repeated = (self.repeated or 0) + other.repeated
        self.dropped.update(other.dropped)
        self.rejected.update(other.rejected)
        self.read_per_file.update(other.read_per_file)
        self.incomplete += other.incomplete

    def to_json(self, *, incomplete: bool = False) -> dict[str, Any]:
        """The manifest's `counts`; `incomplete`: with the inputs not read to their end too, as a Ray
        worker's counts travel to the driver (the manifest lists those apart, `incomplete_inputs`)."""
        return {
            **({} if self.repeated is None else {"repeated": self.repeated}),
            "read": self.read,
            "written": self.written,
            "truncated": self.truncated,
            **({"header_cut": self.header_cut} if self.header_cut else {}),
            **({"special_text": self.special_text} if self.special_text else {}),
            "dropped": {k: v for k, v in sorted(self.dropped.items()) if v},
            "rejected": {k: v for k, v in sorted(self.rejected.items()) if v},
            "tokens": self.tokens,
            "trained_tokens": self.trained_tokens,
            **({"incomplete": self.incomplete, "over_shared": self.over_shared} if incomplete else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Counts:
        """The counts `to_json` wrote (a Ray worker's, `incomplete` included)."""
        return cls(read=data["read"], written=data["written"], truncated=data["truncated"], tokens=data["tokens"],
                   trained_tokens=data["trained_tokens"], repeated=data.get("repeated"),
                   dropped=Counter(data["dropped"]), rejected=Counter(data["rejected"]),
                   incomplete=list(data.get("incomplete", [])), over_shared=data.get("over_shared", 0),
                   header_cut=data.get("header_cut", 0), special_text=data.get("special_text", 0))


class Timings(Counter[str]):
    """Wall seconds per stage (shown by `etl run --timings`, kept out of the manifest, which
    must be byte-identical across runs). The parse stage adds from the prefetch thread."""

    @contextlib.contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Add the wall time of the block to `self[stage]`."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self[stage] += time.perf_counter() - started
