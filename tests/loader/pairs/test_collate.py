"""Padded preference batches equal TRL 1.16's DataCollatorForPreference on the same rows.

TRL's collator is the judge (random rows by hypothesis, and the rows of a real `etl run`
output); etl's completion_mask is TRL's AND the data's chosen/rejected mask, computed here from
the rows by hand.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.cli import main
from etl.columns import CHOSEN_MASK, REJECTED_MASK
from etl.errors import EtlError
from etl.loader import (
    PadOptions,
    ParquetLoader,
    collate_pairs,
    collate_unpaired,
    rows_from_examples,
)

dpo = pytest.importorskip("trl.trainer.dpo_trainer")

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "preference"


def trl(examples: list[dict], **options: object) -> dict[str, np.ndarray]:
    ids_only = [{k: list(map(int, v)) for k, v in e.items() if k.endswith("_ids")} for e in examples]
    return {k: v.numpy() for k, v in dpo.DataCollatorForPreference(**options)(ids_only).items()}


def expected_completion_mask(examples: list[dict], trl_mask: np.ndarray, **cut: object) -> np.ndarray:
    """TRL's mask AND the data's masks, laid out as TRL lays out the rows (cut as it cuts)."""
    data = [[True] * len(e["prompt_ids"]) + list(e.get(CHOSEN_MASK, [True] * len(e["chosen_ids"])))
            for e in examples]
    data += [[True] * len(e["prompt_ids"]) + list(e.get(REJECTED_MASK, [True] * len(e["rejected_ids"])))
             for e in examples]
    out = np.zeros_like(trl_mask)
    for r, row in enumerate(data):
        if cut.get("max_length") is not None:
            row = row[-cut["max_length"]:] if cut.get("truncation_mode") == "keep_end" else row[: cut["max_length"]]
        out[r, : len(row)] = row
    return trl_mask * out


ids = st.lists(st.integers(0, 500), max_size=7)


@st.composite
def pair(draw: st.DrawFn) -> dict:
    chosen, rejected = draw(ids), draw(ids)
    # A prompt of one token at least (etl's prompts end with the generation header): TRL types
    # an empty row's tensor float32, and the batch takes the first row's dtype.
    prompt = draw(st.lists(st.integers(0, 500), min_size=1, max_size=7))
    row = {"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected}
    if draw(st.booleans()):
        row[CHOSEN_MASK] = draw(st.lists(st.booleans(), min_size=len(chosen), max_size=len(chosen)))
        row[REJECTED_MASK] = draw(st.lists(st.booleans(), min_size=len(rejected), max_size=len(rejected)))
    return row


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(pair(), min_size=1, max_size=5), pad_id=st.integers(0, 9),
       multiple=st.sampled_from([None, 1, 4, 8]), max_length=st.sampled_from([None, 1, 3, 9]),
       mode=st.sampled_from(["keep_start", "keep_end"]))
def test_equals_trl_collator(rows: list[dict], pad_id: int, multiple: int | None, max_length: int | None,
                             mode: str) -> None:
    if any(CHOSEN_MASK in r for r in rows) and not all(CHOSEN_MASK in r for r in rows):
        rows = [{k: v for k, v in r.items() if not k.endswith("_mask")} for r in rows]  # all or none
    cut = {"max_length": max_length, "truncation_mode": mode}
    want = trl(rows, pad_token_id=pad_id, pad_to_multiple_of=multiple, **cut)
    got = collate_pairs(rows, pad_id=pad_id, pad_to_multiple_of=multiple, **cut)
    assert sorted(got) == sorted(want)
    for key in ("input_ids", "attention_mask"):
        assert got[key].dtype == want[key].dtype and np.array_equal(got[key], want[key]), key
    assert got["completion_mask"].dtype == want["completion_mask"].dtype
    assert np.array_equal(got["completion_mask"], expected_completion_mask(rows, want["completion_mask"], **cut))


def test_trl_docstring_example_by_hand() -> None:
    rows = [{"prompt_ids": [1, 2, 3], "chosen_ids": [4, 5], "rejected_ids": [6], "chosen_mask": [True, False]},
            {"prompt_ids": [7, 8], "chosen_ids": [9], "rejected_ids": [10, 11], "chosen_mask": [True]}]
    out = collate_pairs(rows_from_examples(rows), pad_id=0, width=6)
    assert out["input_ids"].tolist() == [[1, 2, 3, 4, 5, 0], [7, 8, 9, 0, 0, 0], [1, 2, 3, 6, 0, 0],
                                         [7, 8, 10, 11, 0, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0],
                                              [1, 1, 1, 1, 0, 0]]
    # chosen_mask False on token 5; no rejected_mask: every rejected token trained
    assert out["completion_mask"].tolist() == [[0, 0, 0, 1, 0, 0], [0, 0, 1, 0, 0, 0], [0, 0, 0, 1, 0, 0],
                                               [0, 0, 1, 1, 0, 0]]
    with pytest.raises(EtlError, match="more than width=4"):
        collate_pairs(rows, pad_id=0, width=4)
    with pytest.raises(EtlError, match="truncation_mode"):
        collate_pairs(rows, pad_id=0, truncation_mode="left")  # type: ignore[arg-type]


def test_unpaired_is_an_sft_batch_with_labels() -> None:
    rows = [{"prompt_ids": [5, 6], "completion_ids": [7, 8], "completion_mask": [True, False], "label": True},
            {"prompt_ids": [9], "completion_ids": [10], "label": False}]
    out = collate_unpaired(rows, seq_len=5, pad_id=0)
    assert out["x"].tolist() == [[5, 6, 7, 8], [9, 10, 0, 0]]
    assert out["y"].tolist() == [[-100, 7, -100, -100], [10, -100, -100, -100]]  # prompt never trained
    assert out["label"].tolist() == [True, False]
    with pytest.raises(EtlError, match="takes preference rows"):
        collate_pairs(rows, pad_id=0)


@pytest.fixture(scope="module")
def pref_dst(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pairs") / "dst"
    assert main(["run", str(ASSETS / "pairs.jsonl"), str(out), "--input-type", "preference", "--template", "ngpt",
                 "--seq-len", "256", "--quiet"]) == 0
    return out


def test_loader_batches_equal_trl_on_a_real_run(pref_dst: Path) -> None:
    loader = ParquetLoader(pref_dst, batch_size=2, shuffle=False, drop_last=False)
    examples = [loader.dataset[i] for i in range(len(loader.dataset))]
    assert len(examples) >= 4 and all(len(e["prompt_ids"]) and len(e["chosen_ids"]) for e in examples)
    batches = list(loader)
    assert len(batches) == -(-len(examples) // 2)
    for b, batch in enumerate(batches):
        rows = examples[2 * b: 2 * b + 2]
        want = trl(rows, pad_token_id=loader.pad_id)
        assert {k: v.tolist() for k, v in batch.items()} == {k: v.tolist() for k, v in want.items()}
    fixed = ParquetLoader(pref_dst, batch_size=2, shuffle=False, collate=PadOptions("fixed"))
    batch = next(iter(fixed))
    want = trl(examples[:2], pad_token_id=fixed.pad_id, pad_to_multiple_of=256)
    assert batch["input_ids"].shape == (4, 256) and batch["input_ids"].tolist() == want["input_ids"].tolist()
