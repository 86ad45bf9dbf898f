"""`etl inspect`: the trained runs and turn markers shown match the mask and turns written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from etl.analysis.inspect_example import (
    read_example,
    read_turns,
    render_plain,
    render_rich,
    token_strings,
)
from etl.errors import EtlError
from etl.output.manifest import read_manifest
from tests.analysis.stats_fixtures import EXAMPLES, SPECIAL

BY_ID = {v: k for k, v in SPECIAL.items()}
MARKER = re.compile(
    r"^── turn (\d+) · (\w+) · tokens \[(\d+), (\d+)\) · (trained|not trained) ──$",
    re.MULTILINE,
)


def expected_text(ids: list[int]) -> str:
    """The fixture's text: specials by name, runs of byte ids decoded as UTF-8."""
    text, run = [], bytearray()
    for i in [*ids, None]:
        if i is not None and i < 256:
            run.append(i)
            continue
        text.append(run.decode("utf-8"))
        run.clear()
        text.append(BY_ID.get(i, ""))
    return "".join(text)


def shown(piece: str) -> str:
    """The documented display rule: control characters other than newline/tab as \\xNN."""
    return "".join(c if c in "\n\t" or c.isprintable() else f"\\x{ord(c):02x}" for c in piece)


def trained_runs(example: dict, turns: list[dict], strings: list[str]) -> list[str]:
    """Maximal runs of trained tokens; a turn start also ends a run (the marker cuts it)."""
    starts = {t["start"] for t in turns if t["kept"]}
    runs, current = [], None
    for pos, (piece, trained) in enumerate(zip(strings, example["loss_mask"])):
        if current is not None and (not trained or pos in starts):
            runs.append(current)
            current = None
        if trained:
            current = (current or "") + shown(piece)
    return runs + ([current] if current is not None else [])


@pytest.mark.parametrize("split,row", [("train", i) for i in range(6)] + [("val", 0), ("val", 1)])
def test_plain_view_matches_mask_and_turns(dst: Path, split: str, row: int) -> None:
    example = read_example(dst, split=split, row=row)
    turns = read_turns(dst, split=split, example_id=example["id"])
    strings = token_strings(read_manifest(dst), example["input_ids"])
    assert len(strings) == len(example["input_ids"])
    assert "".join(strings) == expected_text(example["input_ids"])  # multi-byte characters whole
    text = render_plain(example, turns, strings)
    header, body = text.split("\n\n", 1)
    assert f"id {example['id']}" in header and f"trained {sum(example['loss_mask'])}" in header
    assert re.findall(r"\[\[(.*?)\]\]", body, re.DOTALL) == trained_runs(example, turns, strings)
    kept = [t for t in turns if t["kept"]]
    assert [
        (int(i), role, int(s), int(e), state == "trained")
        for i, role, s, e, state in MARKER.findall(body)
    ] == [(t["turn_index"], t["role"], t["start"], t["end"], t["trained"]) for t in kept]
    # Remove markers and brackets: what is left is every token, in order.
    bare = (
        MARKER.sub("", body).replace("[[", "").replace("]]", "").replace("\n\n", "\n").strip("\n")
    )
    assert bare == "".join(map(shown, strings)).strip("\n")
    dropped = [t for t in turns if not t["kept"]]
    assert ("dropped turns:" in header) == bool(dropped)


def test_rows_are_counted_across_part_files(dst: Path) -> None:
    train = [e.id for e in EXAMPLES if e.split == "train"]
    assert [read_example(dst, split="train", row=i)["id"] for i in range(len(train))] == train
    found = read_example(dst, split="train", example_id="ex-chat-2")
    assert (found["row"], found["id"]) == (train.index("ex-chat-2"), "ex-chat-2")


def test_token_separator_shows_boundaries(dst: Path) -> None:
    example = read_example(dst, split="val", row=0)
    turns = read_turns(dst, split="val", example_id=example["id"])
    text = render_plain(
        example, turns, token_strings(read_manifest(dst), example["input_ids"]), token_sep="|"
    )
    assert "<|asst|>[[2|<|eot|>]]" in text
    assert "<|usr|>|1|+|1|<|eot|>|\n" in text


def test_rich_view_styles_exactly_the_trained_tokens(dst: Path) -> None:
    example = read_example(dst, split="train", example_id="ex-code-1")
    turns = read_turns(dst, split="train", example_id=example["id"])
    strings = token_strings(read_manifest(dst), example["input_ids"])
    body = render_rich(example, turns, strings, special_ids=set(SPECIAL.values()))[-1]
    token_spans = [s for s in body.spans if " on " in str(s.style)]
    assert len(token_spans) == len(example["input_ids"])
    trained = [("green" in str(s.style)) for s in token_spans]
    assert trained == [bool(m) for m in example["loss_mask"]]
    specials = ["magenta" in str(s.style) for s in token_spans]
    assert specials == [i in BY_ID for i in example["input_ids"]]


def test_errors_say_what_to_do(dst: Path) -> None:
    with pytest.raises(
        EtlError, match=r"row 6 is out of range: split 'train' has 6 rows \(use --row 0..5\)"
    ):
        read_example(dst, split="train", row=6)
    with pytest.raises(EtlError, match="choose --split from: train, val"):
        read_example(dst, split="test", row=0)
    with pytest.raises(EtlError, match="no example with id 'nope'"):
        read_example(dst, split="val", example_id="nope")


def test_multibyte_characters_show_whole(dst: Path) -> None:
    example = read_example(dst, split="val", example_id="ex-code-3")
    turns = read_turns(dst, split="val", example_id=example["id"])
    strings = token_strings(read_manifest(dst), example["input_ids"])
    assert "<|asst|>[[cödé ✓<|eot|>]]" in render_plain(example, turns, strings)
    assert strings[strings.index("✓") :][:3] == ["✓", "", ""]  # 3 bytes, one character
