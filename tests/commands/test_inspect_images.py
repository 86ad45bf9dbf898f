"""`etl inspect` of an image run's example: each image's span (`<|vision_start|>`, its pads,
`<|vision_end|>`) shows as one label with the image's index, size, grid and tokens, in the plain and
the rich rendering; the rest of the rendering is as it was; text runs' renderings are unchanged."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from etl.analysis.inspect_example import (
    image_span_ids,
    read_example,
    read_turns,
    render_plain,
    render_rich,
    token_strings,
)
from etl.analysis.inspect_render import IMAGE_STYLE, image_spans
from etl.cli import main
from etl.output.manifest import read_manifest
from tests.analysis.stats_fixtures import COUNTS, EXAMPLES, REJECTS, write_dst
from tests.analysis.test_image_stats import RECORDS, etl_run, write_images
from tests.images.vl_folder import make_vl_folder

LABEL = re.compile(r"<image \d+: [^<]*? tokens>")
SPAN = re.compile(r"<\|vision_start\|>(?:<\|image_pad\|>)*<\|vision_end\|>")
# Row 1 of RECORDS: images b (112x56) and c (224x112) before the text; its user turn's line.
ROW1_USER = ("<image 1: 112x56 -> grid 1x4x8, 8 tokens><image 2: 224x112 -> grid 1x8x16, 32 tokens>"
             "Who are they?<|im_end|>")
# Row 3: placeholders, d (196x252) in the first user turn, e (300x200, resized) in the second.
ROW3_LABELS = ["<image 1: 196x252 -> grid 1x18x14, 63 tokens>",
               "<image 2: 300x200 -> grid 1x12x18, 54 tokens>"]


@pytest.fixture(scope="module")
def vl_dst(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_images(tmp_path_factory.mktemp("vl"))
    make_vl_folder(root / "processor")
    return etl_run(root, RECORDS, root / "out")


def rendered(dst: Path, row: int, **options: object) -> tuple[str, str]:
    """(the plain rendering with images as labels, the plain rendering of every token)."""
    manifest = read_manifest(dst)
    example = read_example(dst, row=row)
    turns = read_turns(dst, split="train", example_id=example["id"])
    strings = token_strings(manifest, example["input_ids"])
    spans = image_span_ids(manifest)
    return (render_plain(example, turns, strings, image_span_ids=spans, **options),  # type: ignore[arg-type]
            render_plain(example, turns, strings, **options))  # type: ignore[arg-type]


def rows_by_line(dst: Path) -> dict[int, int]:
    """source_line -> row of the train split (rows follow the run's write order)."""
    import polars as pl

    lines = pl.read_parquet(dst / "data" / "train")["source_line"].to_list()
    return {line: row for row, line in enumerate(lines)}


def test_an_image_shows_as_its_label(vl_dst: Path) -> None:
    row = rows_by_line(vl_dst)[1]
    text, _ = rendered(vl_dst, row)
    assert ROW1_USER in text.splitlines()
    assert "<|image_pad|>" not in text and "<|vision_start|>" not in text
    num_tokens = read_example(vl_dst, row=row)["num_tokens"]
    assert f"images 2 · image tokens 40 ({40 / num_tokens:.0%} of tokens)" in text.splitlines()


@pytest.mark.parametrize("line", range(len(RECORDS)))
def test_the_rest_of_the_rendering_is_as_it_was(vl_dst: Path, line: int) -> None:
    text, every_token = rendered(vl_dst, rows_by_line(vl_dst)[line])
    full = every_token.split("\n\n", 1)[1]
    body = text.split("\n\n", 1)[1]
    labels = iter(re.findall(LABEL, body))
    assert body == SPAN.sub(lambda m: next(labels), full)  # turn markers and [[trained]] runs stay put


def test_placeholder_images_across_turns_and_token_boundaries(vl_dst: Path) -> None:
    text, _ = rendered(vl_dst, rows_by_line(vl_dst)[3], token_sep="|")
    assert re.findall(LABEL, text) == ROW3_LABELS
    assert f"|{ROW3_LABELS[1]}|" in text  # one token: separators around it, none inside
    assert "|<|image_pad|>|" not in text


def test_an_example_without_images_in_an_image_run(vl_dst: Path) -> None:
    text, every_token = rendered(vl_dst, rows_by_line(vl_dst)[2])
    assert text == every_token and "images 0 · image tokens 0 (0% of tokens)" in text.splitlines()


def test_rich_rendering_styles_each_label(vl_dst: Path) -> None:
    manifest = read_manifest(vl_dst)
    example = read_example(vl_dst, row=rows_by_line(vl_dst)[3])
    turns = read_turns(vl_dst, split="train", example_id=example["id"])
    strings = token_strings(manifest, example["input_ids"])
    parts = render_rich(example, turns, strings, special_ids=set(), image_span_ids=image_span_ids(manifest))
    body = parts[-1]
    for label in ROW3_LABELS:
        start = body.plain.index(label)
        styles = {str(s.style) for s in body.spans if s.start == start and s.end == start + len(label)}
        assert styles == {IMAGE_STYLE}
    assert "<|image_pad|>" not in body.plain and "image" in parts[1].plain  # the legend names it


def test_the_command_shows_labels_plain_and_in_colour(vl_dst: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # rich wraps at the terminal's width: no wrap inside a line
    row = str(rows_by_line(vl_dst)[1])
    assert main(["inspect", str(vl_dst), "--row", row, "--plain"]) == 0
    assert ROW1_USER in capsys.readouterr().out.splitlines()
    assert main(["inspect", str(vl_dst), "--row", row, "--color"]) == 0
    coloured = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    assert ROW1_USER.replace("<|im_end|>", "") in coloured and "<|image_pad|>" not in coloured


def test_image_spans_are_found_with_numpy() -> None:
    start, pad, end = 7, 8, 9
    ids = [1, start, pad, pad, end, 2, start, end, start, 3, pad, end, pad, start, pad]
    # [1, 4]: two pads; [6, 7]: none; a start whose span holds a text token, and one never closed,
    # are no image's spans
    assert image_spans(ids, [start, pad, end]).tolist() == [[1, 4], [6, 7]]
    assert image_spans(np.arange(5), [start, pad, end]).shape == (0, 2)


def test_text_runs_render_as_before(tmp_path: Path) -> None:
    """The hand-made text output of the stats tests: span ids change nothing."""
    dst = write_dst(tmp_path, EXAMPLES, counts=COUNTS, rejects=REJECTS)
    manifest = read_manifest(dst)
    assert image_span_ids(manifest) is None
    example = read_example(dst, row=0)
    turns = read_turns(dst, split="train", example_id=example["id"])
    strings = token_strings(manifest, example["input_ids"])
    plain = render_plain(example, turns, strings)
    assert plain == render_plain(example, turns, strings, image_span_ids=[256, 257, 258])
    assert "images" not in plain.split("\n\n", 1)[0]
