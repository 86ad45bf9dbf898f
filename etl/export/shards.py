"""Writing side of the bin/h5 export: stream Parquet row groups into per-domain `_DomainWriter`s.

A `_DomainWriter` cuts one domain's sequences into shards (greedy, never splitting a sequence)
and hands each run of whole sequences to its format's `Backend`; `finish` writes meta.json.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl import columns as c
from etl.errors import EtlError
from etl.export.backends import META_FILE, OFFSETS, SEQUENCE, Backend
from etl.output.ownership import RESERVED, tmp_of
from etl.output.parts import open_part
from etl.ragged import Ragged, from_arrow  # numpy/pyarrow only; no torch
from etl.safe_paths import check_no_symlink
from etl.ui.progress import rows_bar

_UNSAFE = re.compile(r'[\x00-\x1f\x7f/\\%:*?"<>|]')


def domain_folder(domain: str) -> str:
    """The folder name of a domain: its value, with path-unsafe characters %XX-escaped.

    Escaping (rather than replacing) keeps the mapping one-to-one, and meta.json keeps the value.
    A name equal to one of DST's own entries or starting with "." gets its first character escaped.
    """
    name = _UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), domain)
    if name.casefold() in RESERVED or name.startswith("."):
        name = f"%{ord(name[0]):02X}{name[1:]}"
    if len(name.encode()) > 240:  # most filesystems stop at 255 bytes per name
        raise EtlError(
            f"domain {domain[:40]!r}... is too long for a folder name; shorten the values"
        )
    return name


@dataclasses.dataclass
class _Shard:
    """Counts of one shard, grown as chunks are appended."""

    num_sequences: int = 0
    num_tokens: int = 0
    num_trained: int = 0


class _DomainWriter:
    """Appends one domain's sequences to its shard files; state: the shards cut so far."""

    def __init__(self, folder: Path, *, backend: Backend, limit: int) -> None:
        self.folder, self.backend, self.limit = folder, backend, limit
        self.shards: list[_Shard] = []
        # `_val` or the domain folder a link: mkdir(parents=True) would create folders through it
        check_no_symlink(folder, backend.output.root).mkdir(parents=True, exist_ok=True)

    def _open(self) -> None:
        self.shards.append(_Shard())
        self.backend.open(self.folder, len(self.shards) - 1)

    def _cuts(self, lengths: np.ndarray) -> Iterator[tuple[int, int, int]]:
        """Greedy fill: (shard, first row, end row) runs; rows go to the open shard while they fit.

        One searchsorted per shard cut, so the Python loop runs per shard, never per row.
        """
        ends = np.cumsum(lengths, dtype=np.int64)
        a = 0
        while a < len(lengths):
            if not self.shards:
                self._open()
            used = self.shards[
                -1
            ].num_tokens  # re-read each run: `add` counts a run before the next
            base = int(ends[a - 1]) if a else 0
            b = int(np.searchsorted(ends, base + self.limit - used, side="right"))
            if b <= a:  # row a does not fit in what is left of the open shard
                if used > 0:
                    self._open()
                    continue
                b = a + 1  # longer than a whole shard: alone in an empty one, never split
            yield len(self.shards) - 1, a, b
            a = b

    def add(self, rg: Ragged) -> None:
        """Append compact examples (``rg.starts`` back to back from 0, as `from_arrow` gives)."""
        assert rg.mask is not None
        for k, a, b in self._cuts(rg.lengths):
            shard = self.shards[k]
            t0 = int(rg.starts[a])
            t1 = int(rg.starts[b - 1] + rg.lengths[b - 1])
            mask = rg.mask[t0:t1]
            streams = {
                SEQUENCE: rg.ids[t0:t1],
                c.LOSS_MASK: mask,
                OFFSETS: shard.num_tokens + np.cumsum(rg.lengths[a:b], dtype=np.int64),
            }
            if rg.weight is not None:
                streams[c.LOSS_WEIGHT] = rg.weight[t0:t1]
            self.backend.append(self.folder, k, streams)
            shard.num_sequences += b - a
            shard.num_tokens += t1 - t0
            shard.num_trained += int(np.count_nonzero(mask))

    def finish(self, head: dict[str, Any]) -> dict[str, int]:
        """Rename the shards to their final names, then write meta.json; returns the counts."""
        files = self.backend.finish(self.folder, len(self.shards))
        meta = _build_meta(head, self.shards, files, weights=self.backend.weights)
        path = self.backend.output.reserve(self.folder / META_FILE)
        tmp = tmp_of(path)
        tmp.write_text(json.dumps(meta, indent=2, allow_nan=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        self.backend.output.add(path)
        return {
            "sequences": meta["num_sequences"],
            "tokens": meta["num_tokens"],
            "trained": meta["num_trained"],
            "shards": len(self.shards),
        }


def _build_meta(
    head: dict[str, Any], shards: list[_Shard], files: list[dict[str, str]], *, weights: bool
) -> dict[str, Any]:
    """meta.json content (every key is documented in `etl.export.token_files`' module docstring)."""
    n_seq = sum(s.num_sequences for s in shards)
    n_tok = sum(s.num_tokens for s in shards)
    first_seq = np.cumsum([0] + [s.num_sequences for s in shards[:-1]]).tolist()
    first_tok = np.cumsum([0] + [s.num_tokens for s in shards[:-1]]).tolist()
    int64 = {"shape": [n_tok], "dtype": "int64", "byteorder": "little"}
    meta = {
        **head,
        "num_sequences": n_seq,
        "num_tokens": n_tok,
        "num_trained": sum(s.num_trained for s in shards),
        SEQUENCE: int64,
        c.LOSS_MASK: dict(int64),
        OFFSETS: {**int64, "shape": [n_seq + len(shards)]},
    }
    if weights:
        meta[c.LOSS_WEIGHT] = {**int64, "dtype": "float32"}
    meta["shards"] = [
        {"files": f, **dataclasses.asdict(s), "first_sequence": q, "first_token": t}
        for f, s, q, t in zip(files, shards, first_seq, first_tok, strict=True)
    ]
    return meta


def _domains_of(table: pa.Table) -> list[tuple[str, np.ndarray | None]]:
    """(domain, row positions) of one row group; None means every row (the common case)."""
    if c.DOMAIN not in table.column_names:
        return [(c.DEFAULT_DOMAIN, None)]
    col = pc.fill_null(table.column(c.DOMAIN).combine_chunks(), c.DEFAULT_DOMAIN)
    col = pc.if_else(pc.equal(col, ""), c.DEFAULT_DOMAIN, col)  # "" cannot name a folder
    enc = pc.dictionary_encode(col)
    values = enc.dictionary.to_pylist()
    if len(values) == 1:
        return [(values[0], None)]
    codes = enc.indices.to_numpy()
    return [(v, np.flatnonzero(codes == k)) for k, v in enumerate(values)]


def row_groups(
    files: list[Path], *, weights: bool, progress: bool = True
) -> Iterator[tuple[list[tuple[str, np.ndarray | None]], Ragged]]:
    """Each row group of the split as (domains, examples); memory: one row group at a time."""
    with rows_bar(files, desc="etl export", enabled=progress) as bar:
        yield from _row_groups(files, weights=weights, bar=bar)


def _row_groups(
    files: list[Path], *, weights: bool, bar: Any
) -> Iterator[tuple[list[tuple[str, np.ndarray | None]], Ragged]]:
    for path in files:
        pf = open_part(path)
        names = pf.schema_arrow.names
        missing = [n for n in (c.INPUT_IDS, c.LOSS_MASK) if n not in names]
        if missing:
            raise EtlError(
                f"{path} lacks columns {missing}; rewrite {path.parents[2]} with `etl run`"
            )
        cols = [n for n in (c.INPUT_IDS, c.LOSS_MASK, c.DOMAIN, c.LOSS_WEIGHT) if n in names]
        for g in range(pf.num_row_groups):
            table = pf.read_row_group(g, columns=cols)
            weight = table.column(c.LOSS_WEIGHT) if c.LOSS_WEIGHT in cols else None
            rg = from_arrow(table.column(c.INPUT_IDS), table.column(c.LOSS_MASK), weight)
            if weights and rg.weight is None:  # a part written without weights: all weigh 1
                rg = dataclasses.replace(rg, weight=np.ones(rg.ids.shape[0], np.float32))
            bar.update(table.num_rows)
            yield _domains_of(table), rg


def write_domains(
    files: list[Path], out: Path, *, backend: Backend, limit: int, progress: bool = True
) -> dict[str, _DomainWriter]:
    """Append every row group to its domains' writers; on failure remove their temporary files."""
    writers: dict[str, _DomainWriter] = {}
    folded: dict[str, str] = {}  # casefolded folder -> domain: macOS/Windows names ignore case
    try:
        for domains, rg in row_groups(files, weights=backend.weights, progress=progress):
            for domain, rows in domains:
                if domain not in writers:
                    folder = domain_folder(domain)
                    if folded.setdefault(folder.casefold(), domain) != domain:
                        raise EtlError(
                            f"domains {folded[folder.casefold()]!r} and {domain!r} differ only in "
                            "case and would share a folder; normalise the domain values"
                        )
                    writers[domain] = _DomainWriter(out / folder, backend=backend, limit=limit)
                writers[domain].add(rg if rows is None else rg.take(rows))
    except BaseException:
        for w in writers.values():
            backend.abort(w.folder, len(w.shards))
        raise
    return writers
