"""Run by test_dataloader's resume test in fresh processes: take k batches and save, or resume.

python resume_script.py first DST K STATE_OUT BATCHES_OUT
python resume_script.py rest DST STATE_IN BATCHES_OUT
"""

from __future__ import annotations

import itertools
import json
import sys

from etl.loader import ParquetLoader, SamplerOptions

LOADER_ARGS = {"batch_size": 4, "seq_len": 16, "seed": 7, "num_workers": 2,
               "sampler": SamplerOptions(shuffle_window=2)}


def dump(batches: list, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump([{k: v.tolist() for k, v in b.items()} for b in batches], f)


def main(argv: list[str]) -> None:
    mode, dst = argv[0], argv[1]
    loader = ParquetLoader(dst, **LOADER_ARGS)
    if mode == "first":
        # Workers prefetch past batch k; the saved state must still say "k delivered".
        batches = list(itertools.islice(iter(loader), int(argv[2])))
        with open(argv[3], "w", encoding="utf-8") as f:
            json.dump(loader.state_dict(), f)
        dump(batches, argv[4])
    else:
        with open(argv[2], encoding="utf-8") as f:
            loader.load_state_dict(json.load(f))
        dump(list(loader) + list(loader), argv[3])  # rest of this epoch, then the next one


if __name__ == "__main__":
    main(sys.argv[1:])
