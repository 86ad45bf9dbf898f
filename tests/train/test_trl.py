"""prepared_dpo_trainer: TRL's own DPOTrainer trains etl's tokenized pairs as written, and a TRL
whose private `_prepare_dataset` changed is refused at once with a message that says what to do."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from etl.cli import main
from etl.errors import EtlError, EtlWarning
from etl.train import prepared_dpo_trainer

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dpo") / "pairs"
    assert main(["run", str(ROOT / "examples" / "pairs"), str(out), "--input-type", "preference",
                 "--tokenizer", "bytes", "--quiet"]) == 0
    return out


def _tokenizer(tmp_path: Path) -> transformers.PreTrainedTokenizerFast:
    """A byte-level tokenizer with a pad token: TRL reads only its pad id (the ids are etl's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens(["<pad>", "<eos>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    return transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"),
                                                pad_token="<pad>", eos_token="<eos>")


def test_trl_trains_etls_pairs_as_written(pairs: Path, tmp_path: Path) -> None:
    train = datasets.load_dataset(str(pairs), cache_dir=str(tmp_path / "cache"))["train"]
    tokenizer = _tokenizer(tmp_path)
    vocab = max(len(tokenizer), 1 + max(max(r) for c in ("prompt_ids", "chosen_ids", "rejected_ids") for r in train[c]))
    config = transformers.Qwen2Config(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config)
    args = trl.DPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, max_steps=1, report_to=[],
                         use_cpu=True, save_strategy="no", logging_strategy="no", seed=0)
    trainer = prepared_dpo_trainer()(model=model, ref_model=copy.deepcopy(model), args=args, train_dataset=train,
                                     processing_class=tokenizer)
    assert type(trainer).__name__ == "PreparedDPOTrainer" and isinstance(trainer, trl.DPOTrainer)
    for column in ("prompt_ids", "chosen_ids", "rejected_ids"):  # not tokenized again: etl's ids
        assert trainer.train_dataset[column] == train[column]
    result = trainer.train()
    assert result.global_step == 1 and torch.isfinite(torch.tensor(result.training_loss))


def test_a_dataset_without_etls_columns_is_refused() -> None:
    cls = prepared_dpo_trainer()
    text = datasets.Dataset.from_dict({"prompt": ["hi"], "chosen": ["a"], "rejected": ["b"]})
    with pytest.raises(EtlError, match=r"the train dataset has no prompt_ids, chosen_ids, rejected_ids"):
        cls._prepare_dataset(None, text, None, None, "train")


def test_a_changed_trl_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    class Reshaped(trl.DPOTrainer):  # a TRL whose private step took other arguments
        def _prepare_dataset(self, dataset, processing_class, args):  # type: ignore[override]
            return dataset

    with pytest.raises(EtlError, match=r"Reshaped._prepare_dataset changed .* found _prepare_dataset\(self, dataset, "
                                       r"processing_class, args\)\. Install trl==1\.16\.\*"):
        prepared_dpo_trainer(Reshaped)
    with pytest.raises(EtlError, match=r"object._prepare_dataset changed .*found no such method"):
        prepared_dpo_trainer(object)
    monkeypatch.setattr(trl, "__version__", "2.0.0")
    with pytest.warns(EtlWarning, match="tested with TRL 1.16, this is 2.0.0"):
        assert issubclass(prepared_dpo_trainer(), trl.DPOTrainer)  # same arguments: used, with a warning
