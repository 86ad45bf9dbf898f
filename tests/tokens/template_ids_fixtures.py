"""Tokenizer directories for the "ids are the template's" property test, trained here (no download):
a byte-level BPE with ChatML's template (its merges join "\\n" runs: the join problem of Qwen) and a
Metaspace BPE loaded by transformers as `LlamaTokenizer`, with Phi-3's rstrip markers and template."""

from __future__ import annotations

import json
import string
from pathlib import Path

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# Llama 3 / Gemma style: the template trims every content.
TRIMMED = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n\n' + m['content'] | trim + '<|im_end|>' }}"
           "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n\n' }}{% endif %}")
PHI_STYLE = ("{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}{% endfor %}"
             "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}")
CORPUS = ["Hello world, it's a test.\n\nLine two:\n\n\n 123 4567 数据 café\t tab\r\n" * 3,
          "the of and to in is  \n \n" * 5, "Question 1? Answer 1. Hi there.\n",
          # every character the property test writes, so none is unknown to the Metaspace model (which
          # transformers rebuilds without an unk token: it would drop an unknown character)
          string.printable + " über 日本語 \u3000 \xa0 \x1c"]


def _config(path: Path, **config: object) -> None:
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


def byte_level_chatml(path: Path, template: str = CHATML) -> Path:
    """A GPT-2 style byte-level BPE (its regex keeps "\\n\\n" one pre-token) with ChatML specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=420, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|im_start|>", "<|im_end|>", "<|endoftext|>"]))
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    _config(path, chat_template=template, eos_token="<|im_end|>", pad_token="<|endoftext|>",
            tokenizer_class="PreTrainedTokenizerFast")
    return path


def metaspace_phi_style(path: Path) -> Path:
    """A SentencePiece-style BPE (Prepend + Replace normalizer) that transformers loads
    as `LlamaTokenizer` (legacy False: "▁" only at the start of the whole text), with markers that
    swallow the whitespace on their right, as Phi-3's do."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse()])
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"],
                                                        initial_alphabet=["▁"]))
    tok.add_special_tokens([AddedToken(t, rstrip=True, special=True)
                            for t in ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    _config(path, chat_template=PHI_STYLE, eos_token="<|endoftext|>", bos_token="<s>", unk_token="<unk>",
            pad_token="<|endoftext|>", tokenizer_class="LlamaTokenizer", legacy=False, add_bos_token=False,
            add_eos_token=False)
    return path
