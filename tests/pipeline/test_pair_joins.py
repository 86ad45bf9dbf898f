"""Preference rows keep `prompt_ids + chosen_ids` (and `+ rejected_ids`) equal to each whole
conversation's ids when a completion's first token merges with the generation header's last."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from etl.cli import main
from tests.tokens.template_ids_fixtures import byte_level_chatml


def test_a_completion_that_merges_with_the_header_keeps_both_conversations(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok_dir = byte_level_chatml(tmp_path / "tok")
    pairs = [{"prompt": [{"role": "user", "content": "Question 1?"}],
              "chosen": [{"role": "assistant", "content": "\n\nAnswer 1."}],  # "\n" + "\n\n" is one token
              "rejected": [{"role": "assistant", "content": "Hi there."}]}]
    src = tmp_path / "pairs.jsonl"
    src.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    out = tmp_path / "out"
    assert main(["run", str(src), str(out), "--input-type", "preference", "--tokenizer", str(tok_dir),
                 "--no-cache", "--quiet"]) == 0
    row = pq.read_table(out / "data" / "train").to_pylist()[0]
    hf = AutoTokenizer.from_pretrained(str(tok_dir))
    for side in ("chosen", "rejected"):
        whole = hf.apply_chat_template(pairs[0]["prompt"] + pairs[0][side], tokenize=True, return_dict=True)
        assert row["prompt_ids"] + row[f"{side}_ids"] == whole["input_ids"]
    # The shared prompt stops before the header's newline, which the chosen completion merged into.
    generation = hf.apply_chat_template(pairs[0]["prompt"], tokenize=True, return_dict=True,
                                        add_generation_prompt=True)["input_ids"]
    assert row["prompt_ids"] == generation[:-1]
