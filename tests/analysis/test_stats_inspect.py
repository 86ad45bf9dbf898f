"""`etl inspect`: the trained runs and turn (or piece) markers shown match the mask and turns
(or the pack index) written."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from etl.analysis.inspect_example import (
    read_example,
    read_turns,
    render_plain,
    render_rich,
    token_strings,
)
from etl.analysis.inspect_pack import read_pack, render_pack_plain, render_pack_rich
from etl.cli import main
from etl.errors import EtlError
from etl.output.manifest import read_manifest
from etl.packing.index import build_pack_index
from etl.packing.index_io import write_pack_index
from etl.packing.pieces import Packing
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


PIECE = re.compile(
    r"^── segment (\d+) · id (\S+) · row (\d+) · tokens \[(\d+), (\d+)\) of (\d+)( · masked by the packer)? ──$",
    re.MULTILINE,
)


def packed_copy(dst: Path, tmp_path: Path, *args: str) -> Path:
    """A copy of the fixture, with a pack index written by `etl pack ARGS` when args are given."""
    out = tmp_path / "dst"
    shutil.copytree(dst, out)
    assert not args or main(["pack", str(out), *args]) == 0
    return out


def test_pack_view_shows_every_piece_with_its_tokens_and_mask(
    dst: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = packed_copy(dst, tmp_path, "--strategy", "sequential", "--seq-len", "48")
    capsys.readouterr()
    rows = {split: [read_example(out, split=split, row=i) for i in range(n)] for split, n in (("train", 6), ("val", 2))}
    for split, examples in rows.items():
        stream = [(e["id"], i, pos) for i, e in enumerate(examples) for pos in range(e["num_tokens"])]
        seen = []
        for k in range(-(-len(stream) // 48)):
            pack = read_pack(out, split=split, pack=k)
            strings = token_strings(read_manifest(out), pack["input_ids"])
            header, body = render_pack_plain(pack, strings).split("\n\n", 1)
            assert f"pack {k} of " in header and "strategy sequential · seq_len 48" in header
            pieces = PIECE.findall(body)
            want_ids, want_mask = [], []
            for segment, example_id, row, start, end, total, masked in pieces:
                example = examples[int(row)]
                assert (example["id"], int(total), masked) == (example_id, example["num_tokens"], "")
                want_ids += example["input_ids"][int(start) : int(end)]
                want_mask += example["loss_mask"][int(start) : int(end)]
                seen += [(example_id, int(row), pos) for pos in range(int(start), int(end))]
            assert [int(p[0]) for p in pieces] == list(range(1, len(pieces) + 1))
            assert (pack["input_ids"], pack["loss_mask"]) == (want_ids, [bool(m) for m in want_mask])
            assert "".join(re.findall(r"\[\[(.*?)\]\]", body, re.DOTALL)) == "".join(
                shown(s) for s, m in zip(strings, want_mask) if m
            )
            bare = PIECE.sub("", body).replace("[[", "").replace("]]", "").replace("\n", "")
            assert bare == "".join(map(shown, strings)).replace("\n", "")
        assert seen == stream  # the packs, in order, are the split's token stream


def test_pack_view_masks_the_pieces_the_packer_masked(dst: Path, tmp_path: Path) -> None:
    out = packed_copy(dst, tmp_path)
    index = build_pack_index(out, "train", strategy="bfd", seq_len=512)
    p = index.packing
    trained = np.arange(len(p)) % 2 == 0  # every other piece masked, as seed 001's packer may
    masked = Packing(doc=p.doc, start=p.start, length=p.length, pack=p.pack, num_packs=p.num_packs, trained=trained)
    write_pack_index(out, {"train": dataclasses.replace(index, packing=masked)})
    pack = read_pack(out, split="train", pack=0)
    strings = token_strings(read_manifest(out), pack["input_ids"])
    body = render_pack_plain(pack, strings).split("\n\n", 1)[1]
    flags = [m == "" for *_, m in PIECE.findall(body)]
    assert flags == [bool(t) for t in trained[: len(flags)]] and not all(flags)
    want = []
    for piece in pack["pieces"]:
        example = read_example(out, split="train", row=piece["row"])
        want += [bool(m) and piece["trained"] for m in example["loss_mask"]]
    assert pack["loss_mask"] == want and sum(want) > 0
    rich = render_pack_rich(pack, strings, special_ids=set(SPECIAL.values()))[-1]
    token_spans = [s for s in rich.spans if " on " in str(s.style)]
    assert [("green" in str(s.style)) for s in token_spans] == want


def test_pack_errors_say_what_to_do(dst: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(EtlError, match=r"no pack index for split 'train'; write one with `etl pack"):
        read_pack(dst, split="train", pack=0)
    out = packed_copy(dst, tmp_path, "--strategy", "bfd", "--split", "val")
    capsys.readouterr()
    with pytest.raises(EtlError, match=r"pack 1 is out of range: split 'val' has 1 packs \(use --pack 0..0\)"):
        read_pack(out, split="val", pack=1)
    assert main(["inspect", str(out), "--pack", "0", "--split", "val", "--plain"]) == 0
    assert "── segment 2 · id " in capsys.readouterr().out
