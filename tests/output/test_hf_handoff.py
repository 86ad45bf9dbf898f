"""The hand-off to Hugging Face: `datasets.load_dataset(DST)` reads the card's splits and configs,
and TRL's SFTTrainer trains exactly etl's `loss_mask` on etl output given as is."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl import columns as c
from etl.cli import main
from etl.output.manifest import read_manifest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # read before huggingface_hub is imported: no hub calls
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
datasets = pytest.importorskip("datasets")
tokenizers = pytest.importorskip("tokenizers")

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
SEQ_LEN = 140  # the 4-turn chats are longer: they lose their oldest pair


def _tokenizer_json(path: Path) -> Path:
    """A byte-level BPE with no merges (256 byte tokens) and ChatML's specials (ids 256..258)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    tok.save(str(path))
    return path


def _chats(n: int) -> list[dict[str, Any]]:
    topics = ["tea", "rain", "maps", "owls", "jazz", "salt", "kites", "moss"]
    chats = []
    for i in range(n):
        t = topics[i % len(topics)]
        turns = [("user", f"tell me about {t} #{i}"), ("assistant", f"{t} is nice ({i}).")]
        if i % 3 == 0:  # multi-turn, past SEQ_LEN: truncation runs too
            turns += [("user", f"more on {t}?"), ("assistant", f"yes: {t} {i} again.")]
        chats.append({"messages": [{"role": r, "content": m} for r, m in turns]})
    return chats


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    raw = root / "raw" / "chats.jsonl"
    raw.parent.mkdir()
    raw.write_text("".join(json.dumps(r) + "\n" for r in _chats(40)), encoding="utf-8")
    config = root / "cfg.json"
    config.write_text(json.dumps({"split": {"val_fraction": 0.25}, "seq_len": SEQ_LEN}), encoding="utf-8")
    return {"raw": raw.parent, "config": config, "tokenizer": _tokenizer_json(root / "tokenizer.json")}


def _run_args(inputs: dict[str, Path], dst: Path) -> list[str]:
    return ["run", str(inputs["raw"]), str(dst), "--config", str(inputs["config"]),
            "--tokenizer", str(inputs["tokenizer"]), "--template", "chatml", "--quiet"]


@pytest.fixture(scope="module")
def dst(inputs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hf_out") / "dst"
    assert main(_run_args(inputs, out)) == 0
    return out


def _parts(dst: Path, folder: str) -> list[Path]:
    return [dst / f["path"] for f in read_manifest(dst)["files"] if f["path"].startswith(folder + "/")]


def _load(dst: Path, *args: str, cache: Path) -> Any:
    datasets.disable_progress_bars()
    return datasets.load_dataset(str(dst), *args, cache_dir=str(cache))


def test_load_dataset_reads_the_splits_and_configs_the_card_lists(dst: Path, tmp_path: Path) -> None:
    # A stray Parquet file of another schema where the parts are: never read (exact paths).
    stray = dst / "data" / "train" / "stray.parquet"
    pq.write_table(pq.read_table(_parts(dst, "turns/train")[0]), stray)
    try:
        ds = _load(dst, cache=tmp_path)
    finally:
        stray.unlink()
    assert sorted(ds) == ["train", "validation"]
    for hf, split in (("train", "train"), ("validation", "val")):
        table = pa.concat_tables([pq.read_table(p) for p in _parts(dst, f"data/{split}")])
        assert ds[hf]["id"] == table.column(c.ID).to_pylist() and len(ds[hf]) > 0
        assert ds[hf][c.ASSISTANT_MASKS] == ds[hf][c.LOSS_MASK] == table.column(c.LOSS_MASK).to_pylist()
    turns = _load(dst, "turns", cache=tmp_path)
    assert sorted(turns) == ["train", "validation"]
    assert len(turns["validation"]) == sum(pq.read_metadata(p).num_rows for p in _parts(dst, "turns/val"))
    assert set(turns["train"]["id"]) == set(ds["train"]["id"])


def test_the_card_is_an_owned_deterministic_file(dst: Path, inputs: dict[str, Path], tmp_path: Path) -> None:
    card = (dst / c.CARD_FILE).read_bytes()
    entry = next(f for f in read_manifest(dst)["files"] if f["path"] == c.CARD_FILE)
    assert entry["bytes"] == len(card) and entry["rows"] is None
    text = card.decode()
    assert text.startswith("---\nconfigs:\n- config_name: default\n") and "  - split: validation\n" in text
    assert "    - data/val/part-00000.parquet\n" in text and "- config_name: turns\n" in text
    assert "*" not in text.split("\n---\n")[0]  # exact part paths, no globs
    other = tmp_path / "again"
    assert main(_run_args(inputs, other)) == 0
    assert (other / c.CARD_FILE).read_bytes() == card
    assert main(_run_args(inputs, other)) == 0  # a rerun replaces its card, same bytes
    assert (other / c.CARD_FILE).read_bytes() == card and not (other / "_journal.jsonl").exists()


def test_a_readme_etl_did_not_write_is_kept_with_one_warning(
    inputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "dst"
    assert main(_run_args(inputs, out)) == 0
    mine = "# my notes on this data\n"
    (out / c.CARD_FILE).write_text(mine, encoding="utf-8")  # etl's card, edited: now the user's
    for _ in range(2):  # the second run: README.md is not in any record at all
        capsys.readouterr()
        assert main(_run_args(inputs, out)) == 0
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if "warning" in line]
        assert len(lines) == 1 and "README.md" in lines[0] and "not etl's" in lines[0], err
        assert (out / c.CARD_FILE).read_text(encoding="utf-8") == mine
        assert c.CARD_FILE not in {f["path"] for f in read_manifest(out)["files"]}
    (out / c.CARD_FILE).unlink()  # once it is gone, etl writes its card again
    assert main(_run_args(inputs, out)) == 0 and (out / c.CARD_FILE).read_text().startswith("---\nconfigs:")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers' own deprecations
def test_sft_trainer_trains_exactly_loss_mask(dst: Path, inputs: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("trl")
    torch = pytest.importorskip("torch")
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from trl import SFTConfig, SFTTrainer

    tok = PreTrainedTokenizerFast(tokenizer_file=str(inputs["tokenizer"]), pad_token="<|endoftext|>",
                                  eos_token="<|im_end|>")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, intermediate_size=32))
    train = _load(dst, cache=tmp_path / "cache")["train"]
    expected = {tuple(r[c.INPUT_IDS]): [i if m else c.IGNORE_INDEX
                                        for i, m in zip(r[c.INPUT_IDS], r[c.LOSS_MASK], strict=True)]
                for r in train}
    assert all(c.IGNORE_INDEX in labels for labels in expected.values())  # the mask is never all ones

    def trainer(dataset: Any) -> Any:
        args = SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=1, per_device_train_batch_size=2,
                         report_to=[], use_cpu=True, max_length=SEQ_LEN, save_strategy="no",
                         logging_strategy="no", dataloader_num_workers=0, seed=0)
        return SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tok)

    sft = trainer(train)
    prepared = sft.train_dataset  # what TRL will batch: every row's labels
    assert len(prepared) == len(train)
    for row in prepared:
        assert row["labels"] == expected[tuple(row[c.INPUT_IDS])]
    seen: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []
    collate = sft.data_collator

    def capture(examples: list[dict[str, Any]]) -> dict[str, Any]:
        seen.append((examples, collate(examples)))
        return seen[-1][1]

    sft.data_collator = capture
    result = sft.train()
    assert result.global_step == 1 and torch.isfinite(torch.tensor(result.training_loss))
    assert seen and all(len(examples) == 2 for examples, _ in seen)  # accelerate fetches one ahead
    for examples, batch in seen:
        for example, labels in zip(examples, batch["labels"].tolist(), strict=True):
            n = len(example[c.INPUT_IDS])  # right-padded with -100 to the longest in the batch
            assert labels[:n] == expected[tuple(example[c.INPUT_IDS])] and set(labels[n:]) <= {c.IGNORE_INDEX}
    # The trap the column closes: without `assistant_masks`, TRL trains every token.
    bare = trainer(train.remove_columns(c.ASSISTANT_MASKS)).train_dataset
    assert all(row["labels"] == row[c.INPUT_IDS] for row in bare)


def test_the_card_lists_only_the_splits_that_have_parts() -> None:
    from etl.output.card import card_text

    manifest = {"etl_version": "0", "seq_len": 64, "template": {"name": "chatml"},
                "tokenizer": {"name": "bytes", "sha256": None},
                "counts": {"read": 3, "written": 2, "truncated": 0, "dropped": {"x": 1}, "rejected": {}}}
    files = [{"path": p, "rows": 1} for p in
             ("data/train/part-00001.parquet", "data/train/part-00000.parquet",
              "turns/train/part-00000.parquet", "_rejects/part-00000.parquet", "data/train/notes.txt")]
    text = card_text(files, manifest, weights=True)
    front = text.split("\n---\n")[0]
    assert "validation" not in front and "_rejects" not in front and "notes.txt" not in front
    assert "    - data/train/part-00000.parquet\n    - data/train/part-00001.parquet\n" in front
    assert "| train | `data/train/` | 2 | 2 |" in text and "loss_weight" in text
    empty = card_text(files[3:4], {**manifest, "counts": {**manifest["counts"], "written": 0}}, weights=False)
    assert empty.startswith("---\nconfigs: []\n")  # datasets then says there is nothing to load
