"""etl's preference pairs against TRL 1.16's own tokenization (`DPOTrainer._prepare_dataset`).

Tiny byte-level tokenizers built here (no ../shared) give hand-worked ids for each case TRL warns
about: a template that renders the prompt alone differently (`template`) and a BPE merge across the
prompt/completion join (`bpe`). The hh-rlhf test (skipped without ../shared) runs the real
`etl run --input-type preference` on the first pairs with Qwen2.5.
"""

from __future__ import annotations

import gzip
import importlib.util
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from etl.analysis.trl_pairs import (
    BPE,
    CONVERSATION,
    EQUAL,
    OTHER,
    SPECIAL_TEXT,
    TEMPLATE,
    TRL_ERROR,
    classify,
    compare,
    hh_record,
    transcript_messages,
    trl_prepare,
)
from tests.formats.test_builders import one

pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("trl", "datasets", "transformers")), reason="needs trl and datasets")

SPECIALS = ["<|user|>", "<|assistant|>", "<|end|>", "<|gen|>"]
# Generation header `<|assistant|><|gen|>`, but `<|assistant|>\n` inside the conversation.
GEN_DIFFERS = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>{% endfor %}"
               "{% if add_generation_prompt %}<|assistant|><|gen|>{% endif %}")
# Plain-text headers: the generation header's trailing space merges with the completion ("ĠH").
PLAIN = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
         "{% if add_generation_prompt %}assistant: {% endif %}")


def tiny(folder: Path, chat_template: str, merges: tuple[tuple[str, str], ...] = ()) -> Any:
    """A byte-level BPE tokenizer (one token per byte, plus `merges`) loaded by transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoTokenizer

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab |= {a + b: len(vocab) + k for k, (a, b) in enumerate(merges)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "<|end|>", "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": chat_template}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return AutoTokenizer.from_pretrained(str(folder))


def ids(tokenizer: Any, *pieces: str) -> list[int]:
    """Hand-worked ids: a piece is one token when the vocabulary has it (a special, a merge such as
    `ĠH`), else one token per character (byte-level: `Ġ` a space, `Ċ` a newline)."""
    out: list[int] = []
    vocab = tokenizer.get_vocab()
    for piece in pieces:
        out += tokenizer.convert_tokens_to_ids([piece] if piece in vocab else list(piece))
    return out


def pair(prompt: str, chosen: str, rejected: str) -> dict[str, Any]:
    return {"prompt": [{"role": "user", "content": prompt}], "chosen": [{"role": "assistant", "content": chosen}],
            "rejected": [{"role": "assistant", "content": rejected}]}


def trl_row(tokenizer: Any, record: dict[str, Any]) -> dict[str, Any]:
    return trl_prepare([record], tokenizer).to_list()[0]


def test_transcripts_cut_as_etls_transcript_builder() -> None:
    text = "  \n\nHuman:\u3000Hi\xa0there \n\nAssistant: \n\nHuman: 2+2?\n\nAssistant:  4.\n\nAssistant:"
    row = one("transcript", {"chosen": text})
    assert transcript_messages(text) == [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
    assert transcript_messages(text)[:2] == [{"role": "user", "content": "Hi\xa0there"},
                                             {"role": "assistant", "content": ""}]
    assert hh_record({"chosen": text, "rejected": "\n\nHuman: x"})["rejected"] == [{"role": "user", "content": "x"}]


def test_template_case_where_the_generation_header_differs(tmp_path: Path) -> None:
    tok = tiny(tmp_path / "tok", GEN_DIFFERS)
    row = trl_row(tok, pair("hi", "yes", "no"))
    # TRL cuts at the common prefix of `...<|assistant|><|gen|>` and `...<|assistant|>\nyes<|end|>`.
    assert row["prompt_ids"] == ids(tok, "<|user|>", "Ċhi", "<|end|>", "<|assistant|>")
    assert row["chosen_ids"] == ids(tok, "Ċyes", "<|end|>")
    ours = (ids(tok, "<|user|>", "Ċhi", "<|end|>", "<|assistant|>", "Ċ"), ids(tok, "yes", "<|end|>"),
            ids(tok, "no", "<|end|>"))
    assert classify(tok, row, ours) == (TEMPLATE, True)
    # etl equal to TRL's cut although TRL warns; a different text is unexplained.
    assert classify(tok, row, (row["prompt_ids"], row["chosen_ids"], row["rejected_ids"])) == (EQUAL, True)
    assert classify(tok, row, (ours[0], ours[2], ours[1]))[0] == OTHER


def test_bpe_case_where_tokens_merge_across_the_join(tmp_path: Path) -> None:
    tok = tiny(tmp_path / "tok", PLAIN, merges=(("Ġ", "H"),))
    row = trl_row(tok, pair("hi", "Hey", "No"))
    # The whole chosen string merges the header's space with `H`: TRL's cut drops the space.
    assert row["prompt_ids"] == ids(tok, "user:ĠhiĊassistant:")
    assert row["chosen_ids"] == ids(tok, "ĠH") + ids(tok, "eyĊ")
    assert row["rejected_ids"] == ids(tok, "ĠNoĊ")
    ours = (ids(tok, "user:ĠhiĊassistant:Ġ"), ids(tok, "HeyĊ"), ids(tok, "NoĊ"))  # per turn: no merge
    assert classify(tok, row, ours) == (BPE, True)


def test_differences_trl_does_not_warn_about(tmp_path: Path) -> None:
    tok = tiny(tmp_path / "tok", PLAIN, merges=(("Ġ", "H"),))
    row = trl_row(tok, pair("hi", "yes", "yo"))  # no `ĠH` at the join: TRL's cut is the prompt
    assert row["prompt_ids"] == ids(tok, "user:ĠhiĊassistant:Ġ")
    # Another conversation than apply_chat_template's (no newline), or the same one cut elsewhere.
    assert classify(tok, row, (row["prompt_ids"], ids(tok, "yes"), row["rejected_ids"])) == (CONVERSATION, False)
    later = (ids(tok, "user:ĠhiĊassistant:Ġy"), ids(tok, "esĊ"), ids(tok, "oĊ"))
    assert classify(tok, row, later) == (OTHER, False)
    special = trl_row(tok, pair("hi", "say <|end|>", "no"))  # TRL parses the special-token text
    ours = (special["prompt_ids"], ids(tok, "sayĠ<|end|>Ċ"), special["rejected_ids"])
    assert classify(tok, special, ours) == (SPECIAL_TEXT, False)


def test_compare_counts_by_reason(tmp_path: Path) -> None:
    tok = tiny(tmp_path / "tok", GEN_DIFFERS)
    rows = trl_prepare([pair("hi", "yes", "no"), pair("a", "b", "c"), pair("x", "y", "z")], tok).to_list()
    same = [(r["prompt_ids"], r["chosen_ids"], r["rejected_ids"]) for r in rows]
    swapped = (same[1][0], same[1][2], same[1][1])
    counts = compare(tok, rows, [same[0], swapped, None])
    assert (counts["pairs"], counts["equal"], counts["trl_warns"], counts["not_in_etl"]) == (2, 1, 2, 1)
    assert counts["differ"] == {TEMPLATE: 0, BPE: 0, SPECIAL_TEXT: 0, CONVERSATION: 0, TRL_ERROR: 0, OTHER: 1}
    assert counts["examples"] == {OTHER: 1}


# --- the real etl run ----------------------------------------------------------------------------

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "preference"


def etl_pairs(src: Path, tokenizer: Path, dst: Path) -> dict[int, Any]:
    """`etl run --input-type preference --template hf`: (prompt, chosen, rejected) ids by source line."""
    import pyarrow.parquet as pq

    from etl import columns as c
    from tests.analysis.stats_fixtures import etl_cli

    run = etl_cli("run", str(src), str(dst), "--input-type", "preference", "--tokenizer", str(tokenizer),
                  "--template", "hf", "--quiet")
    assert run.returncode == 0, run.stderr
    table = pq.read_table(dst / "data").to_pydict()
    return {line: tuple(triple) for line, *triple in
            zip(*(table[k] for k in (c.SOURCE_LINE, c.PROMPT_IDS, c.CHOSEN_IDS, c.REJECTED_IDS)), strict=True)}


def test_etl_run_equals_trl_on_a_tiny_tokenizer(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from tests.commands.test_rough_edges import write_tiny_tokenizer

    folder = write_tiny_tokenizer(tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(str(folder))
    hh = etl_pairs(ASSETS / "hh.jsonl", folder, tmp_path / "hh")
    pairs = etl_pairs(ASSETS / "pairs.jsonl", folder, tmp_path / "pairs")
    records = [json.loads(line) for line in (ASSETS / "pairs.jsonl").read_text().splitlines()]
    # TRL's own reading of the records etl wrote; a string pair is plain text to TRL (no chat
    # template, EOS appended) and a conversation to etl, so it is not compared.
    lines = [i for i in sorted(pairs) if not isinstance(records[i]["chosen"], str)]
    hh_lines = (ASSETS / "hh.jsonl").read_text().splitlines()
    ours = [pairs[i] for i in lines] + [hh[i] for i in sorted(hh)]
    theirs = [records[i] for i in lines] + [hh_record(json.loads(hh_lines[i])) for i in sorted(hh)]
    rows = [trl_row(tok, record) for record in theirs]  # one at a time: explicit and implicit prompts mix
    assert len(rows) >= 5 and [classify(tok, row, p) for row, p in zip(rows, ours, strict=True)] == [(EQUAL, False)] * len(rows)


def test_check_template_counts_pairs_by_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from etl.cli import main
    from tests.commands.test_rough_edges import write_tiny_tokenizer

    folder = write_tiny_tokenizer(tmp_path / "tok")
    src = tmp_path / "pairs.jsonl"
    lines = [pair("Sky?", "Blue.", "Green."), {"chosen": "\n\nHuman: Hi\n\nAssistant: Hello", "rejected":
             "\n\nHuman: Hi\n\nAssistant: Go away"}, pair("Say end.", "<|end|>", "No."), pair("Same", "x", "x")]
    src.write_text("".join(json.dumps(r) + "\n" for r in lines))
    args = ["check-template", str(src), "--tokenizer", str(folder), "--input-type", "preference"]
    assert main([*args, "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["examples"], report["equal"], report["trl_warns"]) == (3, 2, 0)
    assert report["differ"] == {TEMPLATE: 0, BPE: 0, SPECIAL_TEXT: 1, CONVERSATION: 0, TRL_ERROR: 0, OTHER: 0}
    assert sum(report["rejected"].values()) == 1  # chosen equals rejected
    diff = report["first_diff"]
    assert (diff["id"], diff["part"], diff["reason"]) == ("pairs.jsonl:2", "chosen_ids", SPECIAL_TEXT)
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "differ: special_text" in text and "verdict: every pair equals TRL's tokenization" in text

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
HH = SHARED / "hh-rlhf" / "harmless-base-test.jsonl.gz"
QWEN = SHARED / "qwen2.5-tokenizer"
HH_PAIRS = 150


@pytest.mark.skipif(not (HH.is_file() and QWEN.is_dir()), reason="needs ../shared/data (hh-rlhf, Qwen2.5)")
def test_hh_pairs_equal_trls_where_trl_does_not_warn(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    with gzip.open(HH, "rt", encoding="utf-8") as f:
        lines = list(itertools.islice(f, HH_PAIRS))
    src = tmp_path / "hh.jsonl"
    src.write_text("".join(lines), encoding="utf-8")
    written = etl_pairs(src, QWEN, tmp_path / "out")
    ours = [written.get(i) for i in range(HH_PAIRS)]
    tok = AutoTokenizer.from_pretrained(str(QWEN))
    rows = trl_prepare([hh_record(json.loads(line)) for line in lines], tok).to_list()
    verdicts = [classify(tok, row, p) for row, p in zip(rows, ours, strict=True) if p is not None]
    assert len(verdicts) >= HH_PAIRS - 5  # etl rejects a few (an empty completion, prompts that differ)
    unwarned = [i for i, (verdict, warned) in enumerate(verdicts) if not warned and verdict != EQUAL]
    assert not unwarned, f"pairs TRL does not warn about that differ (pair index): {unwarned[:10]}"
    assert not [i for i, (verdict, _) in enumerate(verdicts) if verdict not in (EQUAL, TEMPLATE, BPE)]
