"""`etl check-template` on image data: the reference renders each image as an image part and expands
its `<|image_pad|>` to the count transformers' image processor gives; a processor config other than
etl's shows as examples with other image token counts. On a processor folder written here
(tests/images/vl_folder.py) and made images."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from etl.analysis.check_template import check_template
from etl.analysis.reference import ImageTokens, conversation, image_sources
from etl.cli import main
from etl.config.run_config import RunConfig
from tests.images.vl_folder import image_bytes, make_vl_folder

transformers = pytest.importorskip("transformers")
SIZES = {"wide.png": (300, 200), "tall.jpg": (64, 500), "tiny.png": (10, 10)}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A processor folder (`vl`), images under `data/img`, and chat and alpaca files in `data`."""
    root = tmp_path_factory.mktemp("check")
    make_vl_folder(root / "vl")
    (root / "data" / "img").mkdir(parents=True)
    for name, size in SIZES.items():
        (root / "data" / "img" / name).write_bytes(image_bytes(size, fmt="JPEG" if name.endswith("jpg") else "PNG"))
    uri = "data:image/png;base64," + base64.b64encode(image_bytes((50, 40))).decode()
    chats = [
        {"messages": [{"role": "user", "content": "<image>Who are they?"}, {"role": "assistant", "content": "A cat."},
                      {"role": "user", "content": "And<image> this<image>?"}, {"role": "assistant", "content": "the mat"}],
         "images": ["img/wide.png", "img/tall.jpg", "img/tiny.png"]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}},
                                                   {"type": "text", "text": "What is in the picture?"}]},
                      {"role": "assistant", "content": "the of"}]},
        {"messages": [{"role": "user", "content": "What is <image>?"}, {"role": "assistant", "content": "A cat."}]},
        {"messages": [{"role": "user", "content": "<image>x"}, {"role": "assistant", "content": "y"}],
         "images": ["img/missing.png"]},  # etl run rejects it: counted, not checked
    ]
    (root / "data" / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chats))
    alpaca = [{"instruction": "<image>What is in the picture?", "input": "", "output": "A cat on a mat.",
               "images": ["img/wide.png"]},
              {"history": [["Who?<image>", "the of"]], "instruction": "And", "input": "<image>", "output": "the mat",
               "images": ["img/tall.jpg", "img/tiny.png"]}]
    (root / "data" / "alpaca.json").write_text(json.dumps(alpaca))
    return root


def check(data: Path, name: str, *flags: str) -> dict[str, Any]:
    return json.loads(cli(data, name, "--format", "json", *flags))


def cli(data: Path, name: str, *flags: str) -> str:
    """`etl check-template` on a file of `data`, with the folder's processor: what it prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["check-template", str(data / "data" / name), "--tokenizer", str(data / "vl"), *flags]) == 0
    return out.getvalue()


def test_every_example_with_images_equals_the_reference(data: Path) -> None:
    report = check(data, "chats.jsonl")
    assert (report["examples"], report["identical"], report["images"]) == (3, 3, 4)
    assert report["rejected"] == {"missing_image": 1} and report["differ_image_tokens"] == 0
    assert "Qwen2VLImageProcessorPil" in report["image_reference"]
    report = check(data, "alpaca.json", "--input-type", "instruction")
    assert (report["examples"], report["identical"], report["images"]) == (2, 2, 3)
    # Both sides take the run's pixel bounds, as a trainer sets them on its processor too.
    report = check(data, "chats.jsonl", "--max-pixels", str(8 * 28 * 28))
    assert (report["examples"], report["identical"]) == (3, 3) and "max_pixels=6272" in report["image_reference"]


def test_image_root_is_where_relative_paths_are_read(data: Path, tmp_path: Path) -> None:
    moved = tmp_path / "data"
    moved.mkdir()
    shutil.copy(data / "data" / "alpaca.json", moved)
    report = check_template(str(moved / "alpaca.json"), RunConfig(tokenizer=str(data / "vl"), input_type="instruction",
                                                                 image_root=str(data / "data")))
    assert (report.examples, report.identical, report.images) == (2, 2, 3)


def test_another_processor_config_shows_as_other_image_token_counts(data: Path, tmp_path: Path) -> None:
    other = make_vl_folder(tmp_path / "other", max_pixels=8 * 28 * 28)  # fewer tokens for the big images
    report = check(data, "chats.jsonl", "--processor", str(other))
    # The first record's wide and tall images shrink further; the 50x40 data URI and tiny image do not.
    assert (report["examples"], report["identical"], report["differ_image_tokens"]) == (3, 2, 1)
    assert report["first_diff"]["id"] == "chats.jsonl:0"
    text = cli(data, "chats.jsonl", "--processor", str(other))
    assert "differing, other image token counts             1" in text
    assert "image tokens: each image's <|image_pad|>" in text and str(other) in text


def test_image_parts_and_the_expansion() -> None:
    messages = [{"role": "user", "content": "ab", "image_at": [0, 1, 2]}, {"role": "assistant", "content": "c",
                                                                            "image_at": []}]
    assert conversation(messages, None, ["x"]).messages == [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a"}, {"type": "image"},
                                     {"type": "text", "text": "b"}, {"type": "image"}]},
        {"role": "assistant", "content": "c"}]
    tokens = ImageTokens.__new__(ImageTokens)
    tokens.pad_id, tokens.counts = 9, {"a": 2, "b": 3}
    assert tokens.expand([1, 9, 2, 9], ["a", "b"]) == [1, 9, 9, 2, 9, 9, 9]
    assert tokens.expand([1, 9, 2], ["a", "b"]) == [1, 9, 2]  # one pad for two images: left as it is


def test_image_files_are_found_as_etl_run_finds_them() -> None:
    refs = ['"a.png"', '"/x/b.png"', '"file:///y/c.png"', '"data:image/png;base64,AA"', '{"bytes": null, "path": "d.png"}']
    assert image_sources(refs, base="/data", root=None) == [
        "/data/a.png", "/x/b.png", "/y/c.png", "data:image/png;base64,AA", "/data/d.png"]
    assert image_sources(['"a.png"'], base="/data", root="file:///root") == ["/root/a.png"]
    # What load_image cannot open offline: the record is counted (image_not_local), not checked.
    assert image_sources(['"a.png"', '"s3://bucket/b.png"'], base="/data", root=None) is None
    assert image_sources(['"a.png"'], base="s3://bucket/data", root=None) is None
