"""ParquetLoader reads the manifest's kind: preference pairs (padded or prefix-shared packed) and
unpaired completions (SFT batches plus label), from real `etl run` outputs (bytes tokenizer)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from etl.cli import main
from etl.errors import EtlError, EtlWarning
from etl.loader import PackOptions, ParquetLoader

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "preference"


def run(src: Path, out: Path, kind: str, seq_len: int = 256) -> Path:
    assert main(["run", str(src), str(out), "--input-type", kind, "--template", "ngpt", "--seq-len", str(seq_len),
                 "--quiet"]) == 0
    return out


@pytest.fixture(scope="module")
def pairs_dst(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """30 pairs of 1-2 turn prompts, 60-200 tokens each as prompt + chosen + rejected."""
    root = tmp_path_factory.mktemp("pairs_loader")
    rng = np.random.default_rng(0)
    with open(root / "pairs.jsonl", "w", encoding="utf-8") as f:
        for i in range(30):
            prompt = [{"role": "user", "content": f"question {i} " * int(rng.integers(1, 4))}]
            answer = [{"role": "assistant", "content": f"answer {i} " * int(rng.integers(1, 6))}]
            worse = [{"role": "assistant", "content": f"nope {i} " * int(rng.integers(1, 6))}]
            f.write(json.dumps({"prompt": prompt, "chosen": answer, "rejected": worse}) + "\n")
    return run(root / "pairs.jsonl", root / "dst", "preference")


def test_packed_pairs_cover_the_epoch_once(pairs_dst: Path) -> None:
    loader = ParquetLoader(pairs_dst, batch_size=2, packing="bfd", seed=1, drop_last=False)
    batches = list(loader)
    assert loader.dataset.kind == "preference" and loader.skipped_pairs == 0
    keys = {"input_ids", "position_ids", "pair_ids", "part_ids", "completion_mask", "logits_index"}
    assert all(set(b) == keys and b["input_ids"].shape[1] == 256 for b in batches)
    seen = sorted(tuple(b["input_ids"][r, b["pair_ids"][r] == k].tolist())
                  for b in batches for r in range(b["input_ids"].shape[0]) for k in range(1, int(b["pair_ids"][r].max()) + 1))
    rows = [loader.dataset[i] for i in range(len(loader.dataset))]
    want = sorted(tuple(np.concatenate([e["prompt_ids"], e["chosen_ids"], e["rejected_ids"]]).tolist()) for e in rows)
    assert seen == want and len(seen) == 30
    assert max(int(b["pair_ids"].max()) for b in batches) >= 2  # rows share several pairs
    # Same epoch through a worker process (the collate and dataset pickle).
    again = ParquetLoader(pairs_dst, batch_size=2, packing="bfd", seed=1, drop_last=False, num_workers=1)
    assert all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(batches, again, strict=True))


def test_resume_mid_epoch(pairs_dst: Path) -> None:
    loader = ParquetLoader(pairs_dst, batch_size=2, packing="bfd", seed=2, drop_last=False)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    want = list(it)
    resumed = ParquetLoader(pairs_dst, batch_size=2, packing="bfd", seed=2, drop_last=False)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(want) >= 2
    assert all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(want, rest, strict=True))


def test_pairs_over_seq_len_are_skipped_counted_and_warned(pairs_dst: Path) -> None:
    lengths = ParquetLoader(pairs_dst, batch_size=1).dataset.example_lengths()
    seq_len = int(np.median(lengths))
    with pytest.warns(EtlWarning, match=r"pairs hold more than seq_len"):
        loader = ParquetLoader(pairs_dst, batch_size=1, packing="bfd", seq_len=seq_len, drop_last=False)
    assert loader.skipped_pairs == int((lengths > seq_len).sum()) > 0
    packed = sum(int(b["pair_ids"].amax(1).sum()) for b in loader)
    assert packed == int((lengths <= seq_len).sum())


def test_refused_options_say_why(pairs_dst: Path) -> None:
    with pytest.raises(EtlError, match="packed whole"):
        ParquetLoader(pairs_dst, batch_size=1, packing=PackOptions("sequential"))
    with pytest.raises(EtlError, match="domain weights"):
        ParquetLoader(pairs_dst, batch_size=1, packing="bfd", domains={"__default__": 1.0})
    padded = ParquetLoader(pairs_dst, batch_size=4, domains={"__default__": 1.0})  # padded pairs take them
    assert next(iter(padded))["input_ids"].shape[0] == 8


def test_unpaired_rows_are_sft_rows_with_labels(tmp_path: Path) -> None:
    dst = run(ASSETS / "unpaired.jsonl", tmp_path / "kto", "unpaired")
    loader = ParquetLoader(dst, batch_size=8, shuffle=False, drop_last=False)
    (batch,) = list(loader)
    rows = [loader.dataset[i] for i in range(len(loader.dataset))]
    assert len(rows) >= 2 and batch["label"].tolist() == [bool(r["label"]) for r in rows]
    for i, r in enumerate(rows):
        seq = np.concatenate([r["prompt_ids"], r["completion_ids"]])
        trained = np.concatenate([np.zeros(len(r["prompt_ids"]), bool), r["completion_mask"]])
        n = len(seq) - 1
        assert batch["x"][i, :n].tolist() == seq[:-1].tolist()
        assert batch["loss_mask"][i, :n].tolist() == trained[1:].tolist() and not batch["loss_mask"][i, n:].any()
    packed = ParquetLoader(dst, batch_size=1, packing="bfd", drop_last=False)
    seqs = [np.concatenate([r["prompt_ids"], r["completion_ids"]]).tolist() for r in rows]
    found = []
    for b in packed:
        for k in range(1, int(b["segment_ids"].max()) + 1):
            xs = b["x"][0, b["segment_ids"][0] == k].tolist()  # the last document may lose its last token
            (i,) = [i for i, seq in enumerate(seqs) if seq[: len(xs)] == xs and len(seq) - len(xs) in (0, 1)]
            assert bool(b["label"][0, k - 1]) == bool(rows[i]["label"])
            found.append(i)
    assert sorted(found) == list(range(len(rows)))
