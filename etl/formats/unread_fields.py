"""Message fields a conversation builder does not read: one warning per run for each.

The builders' `json_transform` reads only the keys they know, so a field nothing maps (`name`,
`function_call`, `reasoning_content` under `reasoning_keys: []`) would vanish without a trace.
`UnreadFields.check` reads the field names of the messages of each file's first SAMPLE_LINES
records: one more parse of those records only, a few percent of the parse at worst
(`bench/unread_fields.py`; its figures: docs/design.md, Measured costs).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa

from etl.columns import SOURCE_LINE
from etl.errors import EtlWarning
from etl.formats.base import json_key_path

# Records sampled at the start of every file (lines 0..SAMPLE_LINES-1): a layout shows in its
# first records, and the cost stays bounded however large the file.
SAMPLE_LINES = 1000
# Fields never warned about: metadata that no chat template renders. Kept short on purpose: a
# message's `name` or `tool_call_id` IS rendered by some templates (OpenAI, Mistral), so etl warns.
BUILTIN_IGNORED = ("id",)
IGNORE_OPTION = "ignore_fields"

# The fields of the sampled messages not known yet: json_keys, no value is copied. Usually empty:
# done.
CANDIDATES = """
select list_filter(
    list_distinct(flatten(flatten(list(try(json_keys(line, $messages_path)))))),
    lambda k: not list_contains($known, k)) as fields
from raw
where source_line < $sample_lines"""

# Only when there are candidates: per sampled record, its distinct candidate fields that hold
# something. JSON null, "", [] and {} lose nothing
# (OpenAI exports carry `refusal: null`; Parquet structs give every message every field, null
# where absent), so they do not count.
QUERY = """
with sample as (
    select
        source_line,
        struct_extract_at(try(json_transform(line, $structure)), 1) as msgs
    from raw
    where source_line < $sample_lines
),
fields as (
    select
        source_line,
        unnest(list_distinct(flatten(list_transform(msgs, lambda m: list_transform(
            list_filter(map_entries(m), lambda e: e.value not in ('""', '[]', '{}')),
            lambda e: e.key))))) as field
    from sample
),
final as (
    select
        field,
        count(*) as records,
        min(source_line) as first_line
    from fields
    where list_contains($candidates, field)
    group by field
)
select * from final"""


def _line_numbers(raw: pa.Table) -> np.ndarray:
    """The chunk's source lines (int64, ascending) read from the Arrow buffers.

    Not `to_numpy` nor a compute kernel with a Python scalar: both import pandas where it is
    installed (on the prefetch thread during a run's first parse; docs/design.md, Measured costs).
    """
    parts = [np.zeros(0, np.int64)]
    for chunk in raw.column(SOURCE_LINE).cast(pa.int64()).chunks:
        parts.append(np.frombuffer(chunk.buffers()[1], np.int64)[chunk.offset : chunk.offset + len(chunk)])
    return np.concatenate(parts)


def _warning_text(name: str, *, records: int, sampled: int, option: str | None) -> str:
    """The warning for one unread field: what is lost, and the config key that reads or silences it."""
    if option == "reasoning_keys":
        fix = f'add "{name}" to input.reasoning_keys to read it, or'
    elif option:
        fix = f'set input.{option} to "{name}" to read it, or'
    else:
        fix = "etl has no reader for it;"
    return (f'message field "{name}" is not read (in {records:,} of {sampled:,} records sampled at the '
            f"start of an input file): {fix} list it in input.{IGNORE_OPTION} to silence this warning")


@dataclass
class UnreadFields:
    """The fields one builder reads or ignores, and those already warned about in this run.

    A builder's query carries one; `etl run` builds its query once, so each field warns once
    per run, whatever the number of files and chunks.
    """

    messages_key: str
    known: frozenset[str]  # read by the builder, ignored by the config, or BUILTIN_IGNORED
    hints: Mapping[str, str]  # field -> the option that would read it
    warned: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, messages_key: str, *, read: Collection[str], ignored: Collection[str],
           hints: Mapping[str, str]) -> UnreadFields:
        """The check of a builder that reads the message fields `read`; `ignored` are the config's."""
        return cls(messages_key, frozenset((*read, *ignored, *BUILTIN_IGNORED)), hints)

    def check(self, con: duckdb.DuckDBPyConnection, raw: pa.Table) -> None:
        """Warn about each unread field of a raw chunk's sampled records not warned of yet.

        `raw` is the chunk that `con` has registered as the relation `raw` (the builder's input).
        """
        lines = _line_numbers(raw)
        if not len(lines) or lines[0] >= SAMPLE_LINES:
            return  # past the sample: the usual chunk costs nothing
        sampled = int(np.searchsorted(lines, SAMPLE_LINES))
        for name, records, _ in sorted(self._unread(con), key=lambda r: (r[2], r[0])):
            self.warned.add(name)
            text = _warning_text(name, records=records, sampled=sampled, option=self.hints.get(name))
            warnings.warn(text, EtlWarning, stacklevel=4)

    def _unread(self, con: duckdb.DuckDBPyConnection) -> list[tuple[str, int, int]]:
        """(field, records that have it, first line) of the unread fields of the relation `raw`."""
        known = sorted(self.known | self.warned)
        path = json_key_path(self.messages_key) + "[*]"
        candidates = con.execute(CANDIDATES, {"messages_path": path, "known": known,
                                              "sample_lines": SAMPLE_LINES}).fetchall()[0][0]
        if not candidates:
            return []
        structure = json.dumps({self.messages_key: ["MAP(VARCHAR, JSON)"]})
        return con.execute(QUERY, {"structure": structure, "candidates": candidates,
                                   "sample_lines": SAMPLE_LINES}).fetchall()
