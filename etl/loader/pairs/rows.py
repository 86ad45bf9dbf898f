"""`PairRows`: preference pairs or unpaired (KTO) completions as ragged parts sharing row numbers.

What `ParquetDataset` reads for the manifest kinds ``preference`` (parts prompt, chosen, rejected)
and ``unpaired`` (prompt, completion, plus a bool ``label`` a row). Each part is a `Ragged` over
the same N rows, so a batch is taken, reordered and joined with one numpy pass per part, never
per row. `join` lays several parts of a row end to end (prompt + completion: the padded and the
prefix-shared layouts are both built from it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from etl.columns import (
    CHOSEN_IDS,
    COMPLETION_IDS,
    LABEL,
    PROMPT_IDS,
    REJECTED_IDS,
)
from etl.errors import EtlError
from etl.kinds import KINDS, PREFERENCE, UNPAIRED
from etl.ragged import Ragged, concat, from_arrow, range_gather


@dataclass(frozen=True)
class PairRows:
    """N rows as parts: ``parts[k]`` holds part k of every row (`etl.kinds.Kind.parts` order).

    Attributes:
        kind: ``preference`` or ``unpaired``.
        parts: one `Ragged` per part over the same N rows; completions carry their mask (True =
            trained), the prompt none.
        label: (N,) bool for ``unpaired`` (desirable or not), else None.
    """

    kind: str
    parts: tuple[Ragged, ...]
    label: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.parts[0])

    @property
    def lengths(self) -> np.ndarray:
        """(N,) int64 tokens of each row, all parts (``num_tokens``: what packers bin)."""
        return np.sum([p.lengths for p in self.parts], axis=0, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        """Bytes held by the flat arrays (the dataset's cache budget)."""
        arrays = [a for p in self.parts for a in (p.ids, p.starts, p.lengths, p.mask) if a is not None]
        return sum(a.nbytes for a in arrays)

    def take(self, rows: np.ndarray) -> PairRows:
        """The selected rows, compacted (their tokens copied, one gather per part)."""
        rows = np.asarray(rows, dtype=np.int64)
        return PairRows(self.kind, tuple(p.take(rows) for p in self.parts),
                        None if self.label is None else self.label[rows])

    def reorder(self, order: np.ndarray) -> PairRows:
        """The same rows in another order; no token is copied."""
        return PairRows(self.kind, tuple(p.reorder(order) for p in self.parts),
                        None if self.label is None else self.label[order])

    def example(self, i: int) -> dict[str, np.ndarray]:
        """Row ``i`` under the data's column names (TRL's: ``prompt_ids``, ``chosen_ids``, ...)."""
        out: dict[str, np.ndarray] = {}
        for part, (ids_name, mask_name) in zip(self.parts, KINDS[self.kind].parts, strict=True):
            span = slice(int(part.starts[i]), int(part.starts[i] + part.lengths[i]))
            out[ids_name] = part.ids[span]
            if mask_name is not None:
                out[mask_name] = (np.ones(span.stop - span.start, bool) if part.mask is None
                                  else part.mask[span])
        if self.label is not None:
            out[LABEL] = self.label[i]
        return out

    def join(self, which: Sequence[int] | None = None) -> Ragged:
        """Row i = its parts ``which`` (default all) end to end, mask False on the prompt.

        One `range_gather` over the parts' concatenated flat arrays: call it on a compact
        batch (`take`), not on a whole cached row group. Returns a compact `Ragged` with a mask.
        """
        which = range(len(self.parts)) if which is None else which
        parts = [self.parts[k] for k in which]
        sizes = np.array([len(p.ids) for p in parts], dtype=np.int64)
        base = np.cumsum(sizes) - sizes
        starts = np.stack([p.starts + b for p, b in zip(parts, base, strict=True)], axis=1)
        lengths = np.stack([p.lengths for p in parts], axis=1).astype(np.int64)
        src = range_gather(starts.ravel(), lengths.ravel())
        masks = [np.full(len(p.ids), k != 0) if p.mask is None else p.mask for p, k in zip(parts, which,
                                                                                            strict=True)]
        total = lengths.sum(axis=1)
        ids = np.concatenate([p.ids for p in parts])
        return Ragged(ids[src], np.cumsum(total) - total, total, np.concatenate(masks).astype(bool)[src])


def concat_rows(parts: Sequence[PairRows]) -> PairRows:
    """Join compact `PairRows` of one kind (copies their tokens once)."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    joined = tuple(concat([p.parts[k] for p in parts]) for k in range(len(first.parts)))
    label = None if first.label is None else np.concatenate([p.label for p in parts])  # type: ignore[misc]
    return PairRows(first.kind, joined, label)


def part_columns(kind: str, names: Sequence[str]) -> list[str]:
    """The columns to read for ``kind`` among the file's ``names`` (a mask column may be absent).

    Raises:
        EtlError: an unknown kind, or an ids / label column missing.
    """
    if not (found := KINDS.get(kind)) or not found.pair:
        raise EtlError(f"unknown data kind {kind!r} in the manifest; this etl reads "
                       f"{', '.join(KINDS)}: upgrade etl or rerun `etl run`")
    label = [found.label] if found.label else []
    wanted = [c for ids, mask in found.parts for c in (ids, mask) if c is not None] + label
    required = [ids for ids, _ in found.parts] + label
    missing = [c for c in required if c not in names]
    if missing:
        raise EtlError(f"the {kind} data lacks columns {missing}; rerun `etl run`")
    return [c for c in wanted if c in names]


def read_rows(kind: str, table: pa.Table) -> PairRows:
    """A row group's `PairRows` from its columns (zero copy for the ids, masks unpacked once)."""
    parts = []
    for ids, mask in KINDS[kind].parts:
        has_mask = mask is not None and mask in table.column_names
        parts.append(from_arrow(table.column(ids), table.column(mask) if has_mask else None))
    label = None
    if KINDS[kind].label:
        column = table.column(LABEL)
        if column.null_count:
            raise EtlError(f"the unpaired data has {column.null_count} null labels; rerun `etl run`")
        label = column.to_numpy(zero_copy_only=False).astype(bool)
    return PairRows(kind, tuple(parts), label)


def rows_from_examples(examples: Sequence[Mapping[str, object]]) -> PairRows:
    """`PairRows` from per-row dicts (TRL's ``prompt_ids``/``chosen_ids``/``rejected_ids``, optional
    masks; or ``prompt_ids``/``completion_ids``/``label``): what ``dataset[i]`` returns.

    Raises:
        EtlError: an empty list, or rows of neither layout.
    """
    if not examples:
        raise EtlError("cannot collate an empty batch; check the sampler's batch_size")
    kind = PREFERENCE if CHOSEN_IDS in examples[0] else UNPAIRED
    if KINDS[kind].parts[1][0] not in examples[0] or PROMPT_IDS not in examples[0]:
        raise EtlError(f"rows need {PROMPT_IDS} and {CHOSEN_IDS}/{REJECTED_IDS} (preference) or "
                       f"{COMPLETION_IDS}/{LABEL} (unpaired); got {sorted(examples[0])}")
    parts = []
    for ids_name, mask_name in KINDS[kind].parts:
        ids = [np.asarray(e[ids_name], dtype=np.int64).reshape(-1) for e in examples]
        lengths = np.array([len(i) for i in ids], dtype=np.int64)
        mask = None
        if mask_name is not None and any(mask_name in e for e in examples):  # a row without: all trained
            mask = np.concatenate([np.asarray(e.get(mask_name, np.ones(n, bool)), dtype=bool).reshape(-1)
                                   for e, n in zip(examples, lengths, strict=True)])
            if len(mask) != lengths.sum():
                raise EtlError(f"`{mask_name}` and `{ids_name}` differ in length in some rows")
        flat = np.concatenate(ids)
        parts.append(Ragged(flat, np.cumsum(lengths) - lengths, lengths, mask))
    label = np.array([bool(e[LABEL]) for e in examples]) if KINDS[kind].label else None
    return PairRows(kind, tuple(parts), label)
