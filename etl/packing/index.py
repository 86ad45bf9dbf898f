"""The pack index of `etl pack`: which pieces of which examples fill each pack, without tokens.

`build_pack_index` reads a split's `id` and `num_tokens` columns (8-40 bytes per example, never
`input_ids`) and packs the lengths with a strategy of `PACKERS`; `index_table` / `index_packing`
convert between a `Packing` and the list-column table of `DST/packs/<split>/part-*.parquet` in a
few vectorized Arrow calls. Writing and reading the folder is `etl.packing.index_io`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl import columns as c
from etl.errors import EtlError
from etl.output.manifest import read_manifest
from etl.output.parts import fingerprint, listed_parts, listed_splits, open_part
from etl.packing.pieces import Packing, held_tokens, keep_end
from etl.packing.turn_spans import header_lengths, turn_spans

# Strategies that cut an example longer than S into pieces of several packs (no token lost);
# the others place whole examples, so a longer one is clipped to S first (`truncation`).
SPLITTING = frozenset({"sequential", "stream"})

PACKS_SCHEMA = pa.schema(
    [
        (c.PACK_ID, pa.int64()),
        (c.PIECE_IDS, pa.list_(pa.string())),
        (c.PIECE_ROWS, pa.list_(pa.int64())),
        (c.PIECE_OFFSETS, pa.list_(pa.int32())),
        (c.PIECE_LENGTHS, pa.list_(pa.int32())),
        (c.PIECE_TRAINED, pa.list_(pa.bool_())),
        (c.NUM_TOKENS, pa.int32()),
    ]
)


@dataclass(frozen=True)
class PackIndex:
    """The packs of one split.

    Attributes:
        packing: pieces in packs; ``packing.doc`` is the example's global row in the split (rows
            numbered over the split's data parts in the manifest's order, no filtering).
        strategy: the `PACKERS` name that packed it.
        seq_len: S, the most tokens of a pack.
        seed: the packer's seed.
        options: the packer's knobs as given (``buffer_docs``, ``max_docs_per_bin``), JSON-able.
        fingerprint: `etl.output.parts.fingerprint` of the split's data parts it was built from.
        ids: (P,) example id of each piece (object array), or None when not read.
        clipped: examples longer than S that a whole-example packer clipped to S tokens.
        truncation: which S tokens a clipped example keeps: ``right`` the first, ``left`` the last.
        example_tokens: tokens of the split's examples (the stream a packer is fed).
        skipped_tokens: of those, the ones no pack holds (a clipped example's cut tokens, the tails
            the stream packer skips); the repeats stream injects do not make up for them.
    """

    packing: Packing
    strategy: str
    seq_len: int
    seed: int
    options: dict[str, Any]
    fingerprint: str
    ids: np.ndarray | None = None
    clipped: int = 0
    truncation: str = "right"
    example_tokens: int = 0
    skipped_tokens: int = 0

    def summary(self) -> dict[str, Any]:
        """What `_packs.json` records per split (JSON-able). `utilization` is how full the packs
        are; `stream_utilization` how much of the examples' tokens (the stream) they hold, once
        each: at a small S stream fills its packs (1.0) while it skips most tokens."""
        p = self.packing
        total = self.example_tokens
        # Distinct examples with a piece: every example of the split, for every packer here.
        examples = int(np.count_nonzero(np.bincount(p.doc))) if len(p) else 0
        return {
            "strategy": self.strategy,
            "seq_len": self.seq_len,
            "seed": self.seed,
            "options": dict(self.options),
            "truncation": self.truncation,
            "num_packs": p.num_packs,
            "num_pieces": len(p),
            "num_examples": examples,
            "num_tokens": int(p.length.sum()),
            "clipped": self.clipped,
            "utilization": p.utilization(self.seq_len),
            "example_tokens": self.example_tokens,
            "skipped_tokens": self.skipped_tokens,
            "stream_utilization": (total - self.skipped_tokens) / total if total else 0.0,
            "fingerprint": self.fingerprint,
        }


def split_parts(dst: str | os.PathLike[str], split: str, manifest: dict[str, Any]) -> list[Path]:
    """The split's data parts as the manifest lists them (checked), or an error naming the splits."""
    parts = listed_parts(dst, f"{c.DATA_DIR}/{split}", manifest=manifest)
    if not parts:
        present = ", ".join(listed_splits(dst, manifest)) or "none"
        raise EtlError(f"split {split!r} has no data in {dst} (splits present: {present}); "
                       "pick one with --split")
    return parts


def _read_columns(parts: list[Path], columns: list[str]) -> pa.Table:
    """Only `columns` of every part, in order (page checksums verified as pages are read)."""
    return pa.concat_tables([open_part(p).read(columns=columns) for p in parts])


def build_pack_index(
    dst: str | os.PathLike[str],
    split: str,
    *,
    strategy: str,
    seq_len: int,
    seed: int = 0,
    truncation: str = "right",
    **options: Any,
) -> PackIndex:
    """Pack one split of an `etl run` output from its lengths (no token is read).

    Args:
        dst: an `etl run` output.
        split: the split to pack (`data/<split>`).
        strategy: a name of `PACKERS` (bfd, ffd, sequential, stream).
        seq_len: S, the most tokens of a pack.
        seed: seed of the packer's random choices (the stream packer has none either; kept).
        truncation: ``right`` (first S tokens) or ``left`` (last S) for an example longer than S
            that a whole-example packer (bfd, ffd) places; sequential and stream split it.
        **options: the packer's knobs; None values are left out (the packer's default).

    Returns:
        The split's `PackIndex`, with the example id of every piece.

    Raises:
        EtlError: DST is not a finished output, the split has no data, or an option is invalid.
    """
    from etl.packing.registry import PACKERS, pack  # the packers' numpy code, only when packing

    if strategy not in PACKERS:
        raise EtlError(f"packing strategy {strategy!r} is not available here; choose one of "
                       f"{', '.join(sorted(PACKERS))}")
    if truncation not in c.CUT_SIDES:
        raise EtlError(f"truncation must be one of {', '.join(c.CUT_SIDES)}, got {truncation!r}")
    c.check_seq_len(int(seq_len))
    manifest = read_manifest(dst)
    parts = split_parts(dst, split, manifest)
    table = _read_columns(parts, [c.ID, c.NUM_TOKENS])
    lengths = table.column(c.NUM_TOKENS).to_numpy().astype(np.int64)
    options = {k: v for k, v in options.items() if v is not None}
    extra: dict[str, Any] = {}
    if strategy == "stream":
        extra["turns"] = stream_turns(dst, split, manifest, table.column(c.ID))
    whole = strategy not in SPLITTING
    fed = np.minimum(lengths, seq_len) if whole else lengths
    packing = pack(strategy, fed, seq_len=int(seq_len), seed=int(seed), **options, **extra)
    clipped = int(np.count_nonzero(lengths > seq_len)) if whole else 0
    if clipped and truncation == "left":  # keep the last S tokens: the piece starts len - S in
        packing = keep_end(packing, lengths)
    _check(packing, lengths, seq_len)
    ids = table.column(c.ID).take(pa.array(packing.doc)).to_numpy(zero_copy_only=False)
    total = int(lengths.sum())
    return PackIndex(packing=packing, strategy=strategy, seq_len=int(seq_len), seed=int(seed),
                     options=options, fingerprint=fingerprint(parts, dst, manifest), ids=ids,
                     clipped=clipped, truncation=truncation, example_tokens=total,
                     skipped_tokens=total - held_tokens(packing, lengths))


def stream_turns(dst: str | os.PathLike[str], split: str, manifest: dict[str, Any], ids: Any) -> Any:
    """Role spans of the split's examples for the stream packer, from its kept `turns` rows."""
    parts = listed_parts(dst, f"{c.TURNS_DIR}/{split}", manifest=manifest)
    if not parts:
        raise EtlError(f"the stream strategy needs the turns of split {split!r}, and {dst} has none; "
                       "rerun `etl run` (it writes DST/turns)")
    turns = _read_columns(parts, [c.ID, c.TURN_INDEX, c.ROLE, c.START, c.END, c.NUM_TOKENS, c.KEPT])
    return turn_spans(turns, ids, header_len=header_lengths(manifest))  # keeps the kept turns


def _check(packing: Packing, lengths: np.ndarray, seq_len: int) -> None:
    """Invariants every index must hold (internal: a packer bug, not a user error)."""
    assert packing.num_packs == 0 or int(packing.pack_tokens().max()) <= seq_len, "a pack exceeds S"
    assert bool(np.all(packing.length >= 1)), "an empty piece"
    end = packing.start + packing.length
    assert bool(np.all((packing.start >= 0) & (end <= lengths[packing.doc]))), "a piece outside its example"


def index_table(index: PackIndex) -> pa.Table:
    """The pack index rows of `index` (schema `PACKS_SCHEMA`): one list item per piece.

    Vectorized: each list column is its flat piece array under the packs' offsets (no per-pack
    Python; most of the time is the id strings: docs/design.md, Measured costs).
    """
    p = index.packing
    if index.ids is None:
        raise ValueError("index_table needs the example ids (read_pack_index(..., ids=True))")
    offsets = pa.array(p.pack_starts(), pa.int32())
    trained = np.ones(len(p), dtype=bool) if p.trained is None else p.trained

    def lists(values: Any, kind: pa.DataType) -> pa.ListArray:
        return pa.ListArray.from_arrays(offsets, pa.array(values, kind))

    return pa.table(
        [
            pa.array(np.arange(p.num_packs, dtype=np.int64)),
            lists(index.ids, pa.string()),
            lists(p.doc, pa.int64()),
            lists(p.start, pa.int32()),
            lists(p.length, pa.int32()),
            lists(trained, pa.bool_()),
            pa.array(p.pack_tokens(), pa.int32()),
        ],
        schema=PACKS_SCHEMA,
    )


def _flat(table: pa.Table, name: str) -> np.ndarray:
    return pc.list_flatten(table.column(name)).to_numpy(zero_copy_only=False)


def index_packing(table: pa.Table, *, ids: bool = True) -> tuple[Packing, np.ndarray | None]:
    """The `Packing` (and the piece ids) of pack index rows, the inverse of `index_table`.

    Raises:
        EtlError: the rows are not numbered 0..n-1, a pack is empty, or `num_tokens` disagrees
            with the pieces (a damaged index: rerun `etl pack`).
    """
    table = table.combine_chunks()
    n = table.num_rows
    rows = table.column(c.PIECE_ROWS)
    pack = pc.list_parent_indices(rows).to_numpy().astype(np.int64)
    length = _flat(table, c.PIECE_LENGTHS).astype(np.int64)
    trained = _flat(table, c.PIECE_TRAINED).astype(bool)
    packing = Packing(
        doc=_flat(table, c.PIECE_ROWS).astype(np.int64),
        start=_flat(table, c.PIECE_OFFSETS).astype(np.int64),
        length=length,
        pack=pack,
        num_packs=n,
        trained=None if trained.all() else trained,
    )
    numbered = np.array_equal(table.column(c.PACK_ID).to_numpy(), np.arange(n))
    tokens = table.column(c.NUM_TOKENS).to_numpy().astype(np.int64)
    if not numbered or not np.array_equal(packing.pack_tokens(), tokens) or (
            n and int(pc.min(pc.list_value_length(rows)).as_py()) < 1):
        raise EtlError("the pack index is damaged (pack ids, pieces and num_tokens disagree); "
                       "rerun `etl pack`")
    piece_ids = _flat(table, c.PIECE_IDS) if ids else None
    return packing, piece_ids
