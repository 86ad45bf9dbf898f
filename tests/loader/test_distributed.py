"""Two ranks under torchrun (gloo, CPU): disjoint rows that together cover the epoch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def test_torchrun_two_ranks_partition_the_epoch(dst: Path, tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(HERE / "dist_script.py"),
        str(dst),
        str(tmp_path),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for drop_last, used in (("True", 48), ("False", 50)):  # 50 rows, B=4, W=2
        rows = [[i for b in r[drop_last]["batches"] for i in b] for r in ranks]
        assert not set(rows[0]) & set(rows[1])  # disjoint
        assert len(rows[0]) + len(rows[1]) == used == len(set(rows[0]) | set(rows[1]))
        if drop_last == "False":
            assert set(rows[0]) | set(rows[1]) == set(range(50))  # the whole epoch
        counts = {len(r[drop_last]["batches"]) for r in ranks}
        assert counts == set(ranks[0][drop_last]["all_counts"]) == {6 if used == 48 else 7}
