"""Run under torchrun by test_distributed: each rank writes the rows it loaded in one epoch.

python -m torch.distributed.run --standalone --nproc_per_node=2 dist_script.py DST OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from etl.loader import ParquetLoader, SamplerOptions


def main(dst: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result = {}
    for drop_last in (True, False):
        # rank / world_size come from the process group; fixture row r starts with token 1000*r.
        loader = ParquetLoader(dst, batch_size=4, seed=11, drop_last=drop_last,
                               sampler=SamplerOptions(shuffle_window=2))
        batches = [(b["x"][:, 0] // 1000).tolist() for b in loader]
        counts = torch.tensor([len(batches)])
        gathered = [torch.zeros(1, dtype=torch.long) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, counts)  # a rank with one batch more would hang a real job
        result[str(drop_last)] = {"batches": batches, "all_counts": [int(c) for c in gathered]}
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
