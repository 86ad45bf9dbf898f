"""Sections of results.md on etl's output in training: packing (time, utilization, next to TRL)
and `ParquetLoader` tokens/s padded vs packed. In process, reusing bench/packing.py's functions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from packing import LOADER_CONFIGS, STRATEGIES, loader_rows, packer_section, trl_section
from results_etl import Data
from results_md import Table, ratio

from etl.columns import DATA_DIR, NUM_TOKENS

PEER_ROWS = 20_000  # TRL is compared on the first 20k lengths, the T0 set


def lengths_of(dst: Path) -> np.ndarray:
    """`num_tokens` of every row of an etl output in file order."""
    return pq.read_table(dst / DATA_DIR, columns=[NUM_TOKENS])[NUM_TOKENS].to_numpy()


def pack_call(strategy: str, lengths: str, seq_len: int, options: dict[str, object]) -> str:
    """The `etl.packing.registry.pack` call of a row, as a command."""
    extra = "".join(f", {k}={v!r}" for k, v in options.items())
    return f'`pack("{strategy}", {lengths}, seq_len={seq_len}{extra})`'


def packing_table(lengths: np.ndarray, seq_len: int, repeats: int, *, trl: bool = True) -> Table:
    """Every etl packer on all lengths; etl bfd and TRL's `pack_dataset(bfd)` on the first 20k."""
    rows = [[f"etl {r[0]}", *r[1:], pack_call(strategy, "lengths", seq_len, options)]
            for r, (_, strategy, options) in zip(packer_section(lengths, seq_len, repeats), STRATEGIES, strict=True)]
    first = lengths[:PEER_ROWS]
    ours = packer_section(first, seq_len, repeats)[0]  # bfd (global)
    rows.append([f"etl {ours[0]}", *ours[1:], pack_call("bfd", f"lengths[:{PEER_ROWS}]", seq_len, {})])
    notes = [(f"Lengths: `num_tokens` of `$T0_ALL_OUT` (etl's output of `$T0_ALL`, {len(lengths):,} rows). "
              f"Seconds are the fastest of {repeats} call(s) (wall, and this process's CPU). Utilization = real tokens / "
             f"(packs × {seq_len}); over bound = packs over ceil(sum / {seq_len}), the fewest possible.")]
    theirs = trl_section(first, seq_len, repeats) if trl else []
    for row in theirs:
        kwargs = '{"batch_size": None}' if "global" in row[0] else "{}"
        rows.append([*row, f'`trl.data_utils.pack_dataset(ds, {seq_len}, strategy="bfd", map_kwargs={kwargs})`'])
    if theirs:
        notes.append(f"TRL bfd (global) seconds / etl bfd (global) seconds on the same {len(first):,} lengths: "
                     f"**{ratio(float(theirs[0][2]) / float(ours[2]))}**.")
    else:
        notes.append("TRL not importable (or skipped): no TRL rows.")
    columns = ["packer", "lengths", "wall s", "CPU s", "packs", "utilization", "over bound %", "command"]
    return Table(f"Packing T0 lengths into {seq_len}-token packs", columns, rows, notes)


def loader_table(data: Data, dst: Path, batches: int) -> Table:
    """`ParquetLoader` batches (B=32, T=2048, no workers) padded vs packed, on etl's T0 output."""
    from loader_throughput import B, T

    results = loader_rows(dst, batches)
    padded = results[0][4] / results[0][2]
    options = dict(LOADER_CONFIGS)
    rows = []
    for label, n, seconds, shape, real in results:
        kwargs = "".join(f", {k}={v!r}" for k, v in options[label].items())
        command = f"`ParquetLoader({data.names.get(str(dst), dst)}, batch_size={B}, seq_len={T + 1}, num_workers=0{kwargs})`"
        rows.append([label, command, str(n), f"{seconds:.2f}", f"{shape / seconds / 1e6:.1f}M",
                     f"{real / seconds / 1e6:.1f}M", f"{real / shape:.3f}", ratio(real / seconds / padded)])
    notes = [(f"Batches of B={B} × T={T} from etl's output of all T0 chats (default settings), after one warm-up batch; "
             "batch tok/s counts every position of a batch, real tok/s the non-padding ones; last column: real tok/s / "
             "padded real tok/s. The pack index is written by `etl.packing.index.build_pack_index` first (not timed). "
             "Workers: none (on 2 cores two workers are slower than none).")]
    columns = ["loader", "command", "batches", "s", "batch tok/s", "real tok/s", "fill", "real tok/s / padded"]
    return Table(f"Loader tokens/s, padded vs packed (B={B}, T={T})", columns, rows, notes)
