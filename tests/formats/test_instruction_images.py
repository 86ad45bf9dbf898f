"""`instruction` records with LLaMA-Factory's image layout: `<image>` placeholders in the
instruction/input/output (and history) text, the images in a top-level list. The builder gives each
message its image offsets and the record its images; `etl run` then gives the ids
`apply_chat_template` gives with each `<|image_pad|>` expanded to the processor's count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.cli import main
from etl.formats.builders import BUILDERS, run_builder
from tests.images.vl_folder import image_bytes, make_vl_folder

ROLES = ("system", "user", "assistant")


def parse(*records: Any, builder: str = "instruction", **options: Any) -> list[dict[str, Any]]:
    lines = [json.dumps(r) for r in records]
    raw = pa.table({"source_line": pa.array(range(len(lines)), pa.int64()), "line": pa.array(lines, pa.large_string())})
    return run_builder(duckdb.connect(), raw, BUILDERS[builder](roles=ROLES, **options)).to_pylist()


def shape(row: dict[str, Any]) -> list[tuple[str, str, list[int] | None]]:
    return [(m["role"], m["content"], m["image_at"]) for m in row["messages"]]


def test_placeholders_become_offsets_in_message_order_and_the_list_the_images() -> None:
    row, = parse({"system": "S", "history": [["<image>hi", "yo"]], "instruction": "Compare <image> and",
                  "input": "<image>", "output": "same<image>", "images": ["a.png", "b.png", "c.png", "d.png"]})
    assert row["reason"] is None
    assert shape(row) == [("system", "S", []), ("user", "hi", [0]), ("assistant", "yo", []),
                          ("user", "Compare  and\n\n", [8, 14]), ("assistant", "same", [4])]
    assert row["images"] == ['"a.png"', '"b.png"', '"c.png"', '"d.png"']  # each image's JSON text


def test_prompt_response_records_and_other_keys_and_placeholders() -> None:
    row, = parse({"prompt": "<image>p", "response": "r", "images": [{"bytes": None, "path": "p.png"}]})
    assert shape(row) == [("user", "p", [0]), ("assistant", "r", [])]
    assert row["images"] == ['{"bytes":null,"path":"p.png"}']
    # LLaVA: one image under `image`, not in a list; another placeholder.
    row, = parse({"instruction": "[img] x", "output": "y", "image": "one.png"}, images_key="image",
                 image_placeholder="[img]")
    assert shape(row) == [("user", " x", [0]), ("assistant", "y", [])] and row["images"] == ['"one.png"']


def test_without_the_images_key_the_placeholder_is_text() -> None:
    without, empty = parse({"instruction": "<image>x", "output": "y"}, {"instruction": "x", "output": "y", "images": []})
    assert shape(without) == [("user", "<image>x", None), ("assistant", "y", None)] and without["images"] is None
    assert shape(empty) == [("user", "x", []), ("assistant", "y", [])] and empty["images"] is None
    ignored, = parse({"instruction": "<image>x", "output": "y", "images": ["a.png"]}, images_key=None)
    assert shape(ignored)[0] == ("user", "<image>x", None) and ignored["images"] is None
    # prompt_completion reads no images: its text stays text whatever keys the record has.
    completion, = parse({"prompt": "<image>x", "completion": "y", "images": ["a.png"]}, builder="prompt_completion")
    assert shape(completion)[0] == ("user", "<image>x", None) and completion["images"] is None


# Text of random pieces and placeholders (including one spelled inside another: "<<image>image>").
PIECES = st.lists(st.one_of(st.just("<image>"), st.text(st.characters(exclude_categories=("Cs",)), max_size=6),
                            st.sampled_from(["<", "image>", "<image", "é"])), max_size=6).map("".join)


@settings(max_examples=150, deadline=None)
@given(instruction=PIECES, input=PIECES, output=PIECES, history=st.lists(st.tuples(PIECES, PIECES), max_size=2),
       system=PIECES, extra=st.integers(-1, 1))
def test_offsets_and_counts_equal_python_on_random_text(instruction: str, input: str, output: str,
                                                      history: list[tuple[str, str]], system: str, extra: int) -> None:
    record = {"instruction": instruction, "input": input, "output": output, "history": history, "system": system}
    texts = [system] * bool(system) + [t for pair in history for t in pair] + [
        "\n\n".join(t for t in (instruction, input) if t), output]
    n = sum(t.count("<image>") for t in texts)
    row, = parse({**record, "images": [f"{i}.png" for i in range(max(0, n + extra))]})
    if extra or n == 0:  # a count that differs is rejected; no placeholder and no image is text alone
        assert row["reason"] == ("image_count_mismatch" if extra and n + extra >= 0 else None)
        return
    assert row["reason"] is None and len(row["images"]) == n
    for text, m in zip(texts, row["messages"], strict=True):
        pieces = text.split("<image>")
        assert m["content"] == "".join(pieces)
        assert m["image_at"] == [len("".join(pieces[:i])) for i in range(1, len(pieces))]


def test_placeholders_and_images_that_disagree_are_rejected_as_the_chat_builder_words_it() -> None:
    records = [{"instruction": "<image>x", "output": "y", "images": ["a.png", "b.png"]},
               {"instruction": "x", "output": "y", "images": "one.png"}]
    rows = parse(*records)
    assert [(r["reason"], r["detail"], r["messages"], r["images"]) for r in rows] == [
        ("image_count_mismatch", '1 image placeholder(s) <image> but "images" holds 2 image(s)', None, None),
        ("image_count_mismatch", '0 image placeholder(s) <image> but "images" holds 1 image(s)', None, None)]
    assert rows[0]["raw"] == json.dumps(records[0])
    chat = parse(*({"messages": [{"role": "user", "content": r["instruction"]}, {"role": "assistant", "content": "y"}],
                    "images": r["images"]} for r in records), builder="chat")
    assert [(r["reason"], r["detail"]) for r in chat] == [(r["reason"], r["detail"]) for r in rows]
    # An empty placeholder places no image (as in chat): a record with images is then a mismatch.
    row, = parse(records[0], image_placeholder="")
    assert (row["reason"], row["detail"]) == ("image_count_mismatch", '0 image placeholder(s)  but "images" holds 2 image(s)')


def test_a_bad_key_option_is_one_error() -> None:
    from etl.errors import EtlError

    with pytest.raises(EtlError, match="images_key"):
        BUILDERS["instruction"](roles=ROLES, images_key="")
    with pytest.raises(EtlError, match="both"):
        BUILDERS["instruction"](roles=ROLES, images_key="input")
    with pytest.raises(EtlError, match="image_placeholder"):
        BUILDERS["instruction"](roles=ROLES, image_placeholder=3)


# --- through `etl run` -----------------------------------------------------------------------

transformers = pytest.importorskip("transformers")


def as_chat(record: dict[str, Any]) -> dict[str, Any]:
    """An alpaca record as the chat record LLaMA-Factory's converter makes of it (etl's separator)."""
    messages = [{"role": "system", "content": record["system"]}] if record.get("system") else []
    for user, assistant in record.get("history", []):
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    prompt = "\n\n".join(t for t in (record["instruction"], record.get("input", "")) if t)
    messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": record["output"]}]
    return {"messages": messages, **({"images": record["images"]} if "images" in record else {})}


def test_ids_equal_apply_chat_template_with_the_processors_image_tokens(tmp_path: Path) -> None:
    from tests.pipeline.test_images import reference

    folder = make_vl_folder(tmp_path / "vl")
    (tmp_path / "img").mkdir()
    for name, size in {"wide.png": (300, 200), "tall.jpg": (64, 500), "tiny.png": (10, 10)}.items():
        (tmp_path / "img" / name).write_bytes(image_bytes(size, fmt="JPEG" if name.endswith("jpg") else "PNG"))
    records = [
        {"instruction": "<image>What is in the picture?", "input": "", "output": "A cat on a mat.",
         "images": ["img/wide.png"]},
        {"system": "Look.", "history": [["Who are they?<image>", "the of"]], "instruction": "And",
         "input": "this<image> one<image>?", "output": "A cat.", "images": ["img/tall.jpg", "img/tiny.png", "img/wide.png"]},
        {"instruction": "What is <image>?", "output": "the mat"},  # no images key: the placeholder is text
        {"instruction": "<image>Who?", "output": "A cat.", "images": ["img/tiny.png", "img/wide.png"]},  # mismatch
    ]
    src = tmp_path / "alpaca.json"
    src.write_text(json.dumps(records))
    out = tmp_path / "out"
    assert main(["run", str(src), str(out), "--tokenizer", str(folder), "--input-type", "instruction", "--quiet"]) == 0
    rows = pl.read_parquet(out / "data" / "train").sort("source_line")
    assert rows["source_line"].to_list() == [0, 1, 2]
    assert pl.read_parquet(out / "_rejects")["reason"].to_list() == ["image_count_mismatch"]
    for row in rows.iter_rows(named=True):
        ids, grids = reference(folder, as_chat(records[row["source_line"]]), tmp_path)
        assert row["input_ids"] == ids, row["source_line"]
        assert row["image_grid_thw"] == grids and len(grids) == len(records[row["source_line"]].get("images", []))
