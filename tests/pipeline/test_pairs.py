"""Preference pairs and unpaired completions through `etl run`: ids against the tokenizer's own
`apply_chat_template`, rejects and drops by reason, truncation policies by hand-worked lengths."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl import columns as c
from etl.cli import main
from etl.pipeline.pair_truncation import (
    PAIR_TRUNCATION_FNS,
    PairLengths,
    PromptUnits,
    drop_oldest_turns,
    keep_end,
    keep_start,
)
from tests.commands.test_rough_edges import write_tiny_tokenizer

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "preference"


def run(tmp: Path, src: Path, kind: str, *flags: str, tok: Path | None = None) -> tuple[list[dict[str, Any]], dict]:
    tok = tok or write_tiny_tokenizer(tmp / "tok")
    dst = tmp / "out"
    code = main(["run", str(src), str(dst), "--input-type", kind, "--tokenizer", str(tok), "--template", "hf",
                 "--quiet", "--no-cache", *flags])
    assert code == 0
    manifest = json.loads((dst / "_manifest.json").read_text())
    rows = pq.read_table(dst / c.DATA_DIR).to_pylist() if manifest["counts"]["written"] else []
    return sorted(rows, key=lambda r: r[c.SOURCE_LINE]), manifest


def as_messages(value: Any, role: str) -> list[dict[str, str]]:
    return value if isinstance(value, list) else [{"role": role, "content": value}]


def rendered(tok: Any, messages: list[dict[str, str]], generation: bool = False) -> list[int]:
    return tok.apply_chat_template(messages, add_generation_prompt=generation, tokenize=True,
                                   return_dict=True)["input_ids"]


def implicit(record: dict[str, Any]) -> tuple[list, list, list]:
    """TRL's extract_prompt on message lists: the shared leading messages are the prompt."""
    chosen, rejected = record["chosen"], record["rejected"]
    k = 0
    while k < min(len(chosen), len(rejected)) and chosen[k] == rejected[k]:
        k += 1
    return chosen[:k], chosen[k:], rejected[k:]


def test_pairs_equal_the_templates_own_rendering(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    rows, manifest = run(tmp_path, ASSETS / "pairs.jsonl", "preference")
    assert manifest[c.MANIFEST_KIND] == "preference"
    counts = manifest["counts"]
    assert (counts["read"], counts["written"]) == (9, 5)
    assert counts["rejected"] == {"chosen_equals_rejected": 1, "empty_completion": 1, "missing_key": 1,
                                  "prompts_differ": 1}
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    records = [json.loads(line) for line in (ASSETS / "pairs.jsonl").read_text().splitlines()]
    for row in rows:
        record = records[row[c.SOURCE_LINE]]
        if "prompt" in record:
            prompt = as_messages(record["prompt"], "user")
            chosen, rejected = as_messages(record["chosen"], "assistant"), as_messages(record["rejected"], "assistant")
        else:
            prompt, chosen, rejected = implicit(record)
        assert row[c.PROMPT_IDS] == rendered(tok, prompt, generation=True)
        assert row[c.PROMPT_IDS] + row[c.CHOSEN_IDS] == rendered(tok, prompt + chosen)
        assert row[c.PROMPT_IDS] + row[c.REJECTED_IDS] == rendered(tok, prompt + rejected)
        assert all(row[c.CHOSEN_MASK]) and all(row[c.REJECTED_MASK])
        assert (row[c.NUM_PROMPT_TOKENS], row[c.NUM_CHOSEN_TOKENS], row[c.NUM_REJECTED_TOKENS]) == (
            len(row[c.PROMPT_IDS]), len(row[c.CHOSEN_IDS]), len(row[c.REJECTED_IDS]))
        assert row[c.NUM_TOKENS] == sum(len(row[k]) for k in (c.PROMPT_IDS, c.CHOSEN_IDS, c.REJECTED_IDS))
        assert (row[c.SCORE_CHOSEN], row[c.SCORE_REJECTED]) == (record.get("score_chosen"),
                                                                record.get("score_rejected"))
    assert counts["tokens"] == sum(r[c.NUM_TOKENS] for r in rows)


def test_hh_transcripts_and_unpaired_records(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok_path = write_tiny_tokenizer(tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(str(tok_path))
    rows, manifest = run(tmp_path / "hh", ASSETS / "hh.jsonl", "preference", tok=tok_path)
    assert [r[c.SOURCE_LINE] for r in rows] == [0, 1]
    assert manifest["counts"]["rejected"] == {"chosen_equals_rejected": 1}
    joke = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Tell me a joke."}]
    assert rows[1][c.PROMPT_IDS] == rendered(tok, joke, generation=True)
    assert rows[1][c.PROMPT_IDS] + rows[1][c.REJECTED_IDS] == rendered(tok, [*joke, {"role": "assistant",
                                                                                      "content": "No."}])
    rows, manifest = run(tmp_path / "kto", ASSETS / "unpaired.jsonl", "unpaired", tok=tok_path)
    assert manifest[c.MANIFEST_KIND] == "unpaired"
    assert manifest["counts"]["rejected"] == {"label_not_bool": 1, "empty_completion": 1}
    assert [r[c.LABEL] for r in rows] == [True, False, False]
    sky = [{"role": "user", "content": "What color is the sky?"}]
    assert rows[0][c.PROMPT_IDS] + rows[0][c.COMPLETION_IDS] == rendered(
        tok, [*sky, {"role": "assistant", "content": "It is blue."}])
    assert all(all(r[c.COMPLETION_MASK]) for r in rows) and c.REJECTED_IDS not in rows[0]


def test_too_long_pairs_are_cut_or_dropped_and_counted(tmp_path: Path) -> None:
    full, _ = run(tmp_path / "full", ASSETS / "pairs.jsonl", "preference")
    longest = max(r[c.NUM_PROMPT_TOKENS] + max(r[c.NUM_CHOSEN_TOKENS], r[c.NUM_REJECTED_TOKENS]) for r in full)
    seq_len = longest - 5
    tok = tmp_path / "full" / "tok"
    for policy in PAIR_TRUNCATION_FNS:
        rows, manifest = run(tmp_path / policy, ASSETS / "pairs.jsonl", "preference", "--seq-len", str(seq_len),
                             "--truncation", policy, tok=tok)
        counts = manifest["counts"]
        assert counts["read"] == counts["written"] + sum(counts["dropped"].values()) + sum(counts["rejected"].values())
        assert all(r[c.NUM_PROMPT_TOKENS] + max(r[c.NUM_CHOSEN_TOKENS], r[c.NUM_REJECTED_TOKENS]) <= seq_len
                   for r in rows), policy
        assert counts["written"] + counts["dropped"].get("pair_too_long", 0) == len(full)
    # pairs.jsonl:1 has two user turns: dropping the older one (13 tokens with the tiny template) fits it
    rows, _ = run(tmp_path / "turns", ASSETS / "pairs.jsonl", "preference", "--seq-len", str(seq_len), tok=tok)
    kept = {r[c.SOURCE_LINE]: r for r in rows}
    before = {r[c.SOURCE_LINE]: r for r in full}
    if 1 in kept and before[1][c.NUM_PROMPT_TOKENS] + 6 > seq_len:
        assert kept[1][c.NUM_TURNS_DROPPED] == 2 and kept[1][c.TRUNCATED]


def test_policies_are_refused_where_they_do_not_apply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tok = write_tiny_tokenizer(tmp_path / "tok")
    args = ["--tokenizer", str(tok), "--template", "hf", "--quiet", "--no-cache"]
    assert main(["run", str(ASSETS / "pairs.jsonl"), str(tmp_path / "a"), "--input-type", "preference",
                 "--truncation", "keep_prefix", *args]) == 2
    assert "keep_prefix' does not apply to preference data" in capsys.readouterr().err
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant",
                                                                                 "content": "b"}]}) + "\n")
    assert main(["run", str(chat), str(tmp_path / "b"), "--truncation", "keep_start", *args]) == 2
    assert "applies to preference data" in capsys.readouterr().err


def test_reruns_are_byte_identical(tmp_path: Path) -> None:
    tok = write_tiny_tokenizer(tmp_path / "tok")
    run(tmp_path / "one", ASSETS / "pairs.jsonl", "preference", tok=tok)
    run(tmp_path / "two", ASSETS / "pairs.jsonl", "preference", tok=tok)
    parts = sorted((tmp_path / "one" / "out" / c.DATA_DIR).rglob("*.parquet"))
    assert parts and all(p.read_bytes() == (tmp_path / "two" / "out" / p.relative_to(tmp_path / "one" / "out"))
                         .read_bytes() for p in parts)


def test_a_mixture_of_pair_sources_and_not_of_kinds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def config(second: str) -> Path:
        path = tmp_path / f"mix-{second}.toml"
        path.write_text(f"""tokenizer = "bytes"
mix_by = "examples"
[[sources]]
name = "pairs"
path = "{ASSETS / 'pairs.jsonl'}"
weight = 0.5
input = {{ type = "preference" }}
[[sources]]
name = "hh"
path = "{ASSETS / 'hh.jsonl'}"
weight = 0.5
input = {{ type = "{second}" }}
""")
        return path

    assert main(["run", "--config", str(config("preference")), str(tmp_path / "mix"), "--quiet", "--no-cache"]) == 0
    manifest = json.loads((tmp_path / "mix" / "_manifest.json").read_text())
    rows = pq.read_table(tmp_path / "mix" / c.DATA_DIR).to_pylist()
    assert manifest[c.MANIFEST_KIND] == "preference" and not (tmp_path / "mix" / c.TURNS_DIR).exists()
    assert {r[c.SOURCE_FILE].split("/")[0] for r in rows} == {"pairs", "hh"}
    assert all(r[c.NUM_TRAINED] == len(r[c.CHOSEN_IDS]) + len(r[c.REJECTED_IDS]) for r in rows)
    assert main(["run", "--config", str(config("transcript")), str(tmp_path / "bad"), "--quiet", "--no-cache"]) == 2
    assert "give preference and sft rows" in capsys.readouterr().err


# --- The policies on hand-worked lengths ---------------------------------------------------------

LENGTHS = PairLengths(prompt=np.array([10, 10, 10]), chosen=np.array([3, 8, 2]), rejected=np.array([5, 1, 9]))
# Pair 1's prompt: head (2 tokens), unit 0 (3), unit 1 (2), last unit (3); pair 2's: head (1), unit 0 (2), last (7).
UNITS = PromptUnits(pair=np.array([1, 1, 2]), unit=np.array([0, 1, 0]), start=np.array([2, 5, 1]),
                    length=np.array([3, 2, 2]))


def test_policies_by_hand() -> None:
    # fit separate, S = 16: lengths 15, 18, 19 (excess 0, 2, 3)
    cut = drop_oldest_turns(LENGTHS, UNITS, seq_len=16, fit="separate")
    assert cut.keep.tolist() == [True, True, False]  # pair 2 frees 2 of the 3 it needs
    assert cut.turns_dropped.tolist() == [0, 1, 1]
    assert np.flatnonzero(~cut.prompt_keep[10:20]).tolist() == [2, 3, 4]  # pair 1's unit 0
    cut = keep_start(LENGTHS, UNITS, seq_len=16, fit="separate")
    assert (cut.chosen.tolist(), cut.rejected.tolist(), cut.keep.all()) == ([3, 6, 2], [5, 1, 6], True)
    cut = keep_end(LENGTHS, UNITS, seq_len=16, fit="separate")
    assert cut.keep.all() and (~cut.prompt_keep).reshape(3, 10).sum(1).tolist() == [0, 2, 3]
    # fit shared, S = 20: lengths 18, 19, 21; the longer completion is cut first
    cut = keep_start(LENGTHS, UNITS, seq_len=20, fit="shared")
    assert (cut.chosen.tolist(), cut.rejected.tolist()) == ([3, 8, 2], [5, 1, 8])
    assert PAIR_TRUNCATION_FNS["drop"](LENGTHS, UNITS, seq_len=20, fit="shared").keep.tolist() == [True, True, False]


def reference_drop_oldest(lengths: PairLengths, units: PromptUnits, seq_len: int, fit: str) -> list[tuple]:
    """One pair at a time: drop its units oldest first while it does not fit."""
    out = []
    for i, need in enumerate(lengths.fit(fit) - seq_len):
        mine = sorted({int(u) for u in units.unit[units.pair == i]})
        freed = dropped = turns = 0
        for u in mine:
            if freed >= need:
                break
            sel = (units.pair == i) & (units.unit == u)
            freed, turns, dropped = freed + int(units.length[sel].sum()), turns + int(sel.sum()), dropped + 1
        out.append((freed >= need, turns if need > 0 else 0))
    return out


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_drop_oldest_turns_matches_a_per_pair_loop(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 6))
    turns = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, 3), st.integers(1, 9)), max_size=15))
    pair = np.array([t[0] for t in turns], np.int64)
    unit = np.array([t[1] for t in turns], np.int64)
    length = np.array([t[2] for t in turns], np.int64)
    prompt = np.bincount(pair, weights=length, minlength=n).astype(np.int64) + 3  # + a head and a last unit
    start = np.zeros(len(turns), np.int64)
    lengths = PairLengths(prompt, np.array(data.draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))),
                          np.array(data.draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))))
    units = PromptUnits(pair, unit, start, length)
    seq_len = data.draw(st.integers(4, 60))
    fit = data.draw(st.sampled_from(["separate", "shared"]))
    cut = drop_oldest_turns(lengths, units, seq_len=seq_len, fit=fit)
    assert list(zip(cut.keep.tolist(), cut.turns_dropped.tolist(), strict=True)) == reference_drop_oldest(
        lengths, units, seq_len, fit)


def test_inspect_shows_a_pair_as_its_three_parts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(ASSETS / "pairs.jsonl"), str(tmp_path / "p"), "--input-type", "preference",
                 "--tokenizer", "bytes", "--quiet", "--no-cache"]) == 0
    assert main(["inspect", str(tmp_path / "p"), "--row", "0", "--plain"]) == 0
    text = capsys.readouterr().out
    prompt, chosen, rejected = (text.index(f"· {part}") for part in ("prompt", "chosen", "rejected"))
    assert prompt < chosen < rejected and "[[It is blue." in text and "[[It is green." in text
    assert "What color is the sky?" in text[prompt:chosen] and "[[" not in text[prompt:chosen]


def test_hh_pairs_as_kto_rows_equal_the_pairs_own_parts(tmp_path: Path) -> None:
    """hh-rlhf's pairs unpaired ({"completion": chosen, "label": true}, then rejected, false): each
    row's prompt and completion are the pair's prompt and its chosen or rejected ids."""
    tok = write_tiny_tokenizer(tmp_path / "tok")
    pairs, _ = run(tmp_path / "pairs", ASSETS / "hh.jsonl", "preference", tok=tok)
    kto = tmp_path / "kto.jsonl"
    records = [json.loads(line) for line in (ASSETS / "hh.jsonl").read_text().splitlines()]
    kto.write_text("".join(json.dumps({"completion": r[side], "label": side == "chosen"}) + "\n"
                           for r in records for side in ("chosen", "rejected")))
    rows, manifest = run(tmp_path / "unpaired", kto, "unpaired", tok=tok)
    assert manifest[c.MANIFEST_KIND] == "unpaired" and manifest["counts"]["written"] == 6
    by_line = {r[c.SOURCE_LINE]: r for r in rows}
    for pair in pairs:
        chosen, rejected = by_line[2 * pair[c.SOURCE_LINE]], by_line[2 * pair[c.SOURCE_LINE] + 1]
        assert chosen[c.PROMPT_IDS] == rejected[c.PROMPT_IDS] == pair[c.PROMPT_IDS]
        assert (chosen[c.COMPLETION_IDS], chosen[c.LABEL]) == (pair[c.CHOSEN_IDS], True)
        assert (rejected[c.COMPLETION_IDS], rejected[c.LABEL]) == (pair[c.REJECTED_IDS], False)
