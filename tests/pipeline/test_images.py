"""Image conversations through `etl run`: every written example's ids equal the tokenizer's
`apply_chat_template` with each `<|image_pad|>` expanded to the count the transformers image
processor gives for that image; bad images are rejected with reasons and the counts add up."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from etl.cli import main
from etl.errors import EXIT_EMPTY
from tests.images.vl_folder import image_bytes, make_vl_folder

transformers = pytest.importorskip("transformers")
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
PAD, START, END = "<|image_pad|>", "<|vision_start|>", "<|vision_end|>"


@pytest.fixture(scope="module")
def vl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_vl_folder(tmp_path_factory.mktemp("vl"))


def as_parts(content: Any, placeholders: bool) -> Any:
    """A message's content as the chat template's parts: `<image>` placeholders become image parts."""
    if isinstance(content, str) and placeholders:
        parts: list[dict[str, Any]] = []
        for i, piece in enumerate(content.split("<image>")):
            parts += [{"type": "image"}] * (i > 0) + [{"type": "text", "text": piece}] * bool(piece)
        return parts
    if isinstance(content, list):
        return [{"type": "image"} if p["type"] in ("image", "image_url") else p for p in content]
    return content


def image_files(record: dict[str, Any], base: Path) -> list[Any]:
    """The record's images in order, as load_image takes them (paths or data URIs)."""
    inline = [p.get("image") or p.get("image_url", {}).get("url") for m in record["messages"]
              if isinstance(m["content"], list) for p in m["content"] if p["type"] in ("image", "image_url")]
    top = iter(record.get("images", []))
    return [str(base / ref) if ref and not ref.startswith("data:") else (ref or str(base / next(top)))
            for ref in inline] or [str(base / p) for p in record.get("images", [])]


def reference(folder: Path, record: dict[str, Any], base: Path) -> tuple[list[int], list[list[int]]]:
    """(ids, grids) as transformers gives them: apply_chat_template, then each image's pads expanded."""
    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil
    from transformers.image_utils import load_image

    tok = AutoTokenizer.from_pretrained(folder)
    proc = Qwen2VLImageProcessorPil.from_pretrained(folder)
    placeholders = "images" in record and not any(isinstance(m["content"], list) for m in record["messages"])
    messages = [{"role": m["role"], "content": as_parts(m["content"], placeholders)} for m in record["messages"]]
    text = tok.apply_chat_template(messages, tokenize=False)
    files = image_files(record, base)
    grids = proc(images=[load_image(f) for f in files], return_tensors="np")["image_grid_thw"] if files else []
    pieces = text.split(PAD)
    merge = proc.merge_size ** 2
    text = pieces[0] + "".join(PAD * int(g.prod() // merge) + p for g, p in zip(grids, pieces[1:], strict=True))
    return tok(text, add_special_tokens=False)["input_ids"], [[int(v) for v in g] for g in grids]


def run(folder: Path, records: list[dict[str, Any]], tmp_path: Path, *args: str, status: int = 0
        ) -> tuple[pl.DataFrame, dict[str, Any]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    src = tmp_path / "data.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    dst = tmp_path / "out"
    assert main(["run", str(src), str(dst), "--tokenizer", str(folder), "--quiet", *args]) == status
    rows = pl.read_parquet(dst / "data" / "train") if (dst / "data" / "train").exists() else pl.DataFrame()
    return rows.sort("source_line") if rows.height else rows, json.loads((dst / "_manifest.json").read_text())


def rejects(tmp_path: Path) -> dict[int, str]:
    found = pl.read_parquet(tmp_path / "out" / "_rejects")
    return dict(zip(found["source_line"].to_list(), found["reason"].to_list(), strict=True))


@pytest.fixture
def pictures(tmp_path: Path) -> Path:
    """Images of every mode, several sizes, an EXIF-rotated JPEG and a 3-frame GIF, in tmp_path/img."""
    folder = tmp_path / "img"
    folder.mkdir()
    made = {"wide.jpg": image_bytes((300, 200), fmt="JPEG"), "grey.png": image_bytes((64, 500), "L"),
            "alpha.png": image_bytes((50, 50), "RGBA"), "tiny.png": image_bytes((10, 10)),
            "turned.jpg": image_bytes((120, 40), fmt="JPEG", orientation=6),
            "frames.gif": image_bytes((40, 30), "P", "GIF", frames=3), "big.png": image_bytes((900, 700))}
    for name, data in made.items():
        (folder / name).write_bytes(data)
    return folder


def conversations(pictures: Path) -> list[dict[str, Any]]:
    """One record per layout: TRL parts with paths, bare parts with a top-level list, placeholders,
    an OpenAI data URI, several images across turns, an image in an assistant turn."""
    uri = "data:image/png;base64," + base64.b64encode((pictures / "alpha.png").read_bytes()).decode()
    return [
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "img/wide.jpg"},
                                                    {"type": "text", "text": "What is in the picture?"}]},
                      {"role": "assistant", "content": "A cat on a mat."}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Who are they?"}, {"type": "image"},
                                                    {"type": "image"}]},
                      {"role": "assistant", "content": "the of and"}], "images": ["img/grey.png", "img/turned.jpg"]},
        {"messages": [{"role": "user", "content": "<image>Who are they?"}, {"role": "assistant", "content": "A cat."},
                      {"role": "user", "content": "And this<image> one<image>?"},
                      {"role": "assistant", "content": "the mat"}],
         "images": ["img/frames.gif", "img/tiny.png", "img/big.png"]},
        {"messages": [{"role": "system", "content": "Look."},
                      {"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}},
                                                   {"type": "text", "text": "is in"}]},
                      {"role": "assistant", "content": [{"type": "text", "text": "Here: "},
                                                        {"type": "image", "image": "img/tiny.png"}]}]},
    ]


def test_ids_equal_apply_chat_template_with_the_processors_image_tokens(vl: Path, pictures: Path,
                                                                        tmp_path: Path) -> None:
    records = conversations(pictures)
    rows, manifest = run(vl, records, tmp_path)
    assert rows.height == len(records) and manifest["counts"]["written"] == len(records)
    tok = transformers.AutoTokenizer.from_pretrained(vl)
    span = set(tok.convert_tokens_to_ids([PAD, START, END]))
    for row in rows.iter_rows(named=True):
        record = records[row["source_line"]]
        ids, grids = reference(vl, record, tmp_path)
        assert row["input_ids"] == ids, row["source_line"]
        assert row["image_grid_thw"] == grids
        assert row["num_image_tokens"] == sum(t * h * w // 4 for t, h, w in grids)
        assert sum(i == tok.convert_tokens_to_ids(PAD) for i in ids) == row["num_image_tokens"]
        # Images never train, not even in an assistant turn; the rest of each assistant turn does.
        trained = [i for i, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
        assert not span & set(trained)
        answers = [m["content"] if isinstance(m["content"], str) else m["content"][0]["text"]
                   for m in record["messages"] if m["role"] == "assistant"]
        assert tok.decode(trained) == "".join(a + "<|im_end|>" for a in answers)
        files = image_files(record, tmp_path)
        assert [img["bytes"] for img in row["images"]] == [
            base64.b64decode(f.split(",", 1)[1]) if f.startswith("data:") else Path(f).read_bytes() for f in files]
        assert row["image_sha256"] == [hashlib.sha256(img["bytes"]).hexdigest() for img in row["images"]]


def test_reference_mode_writes_where_each_image_is(vl: Path, pictures: Path, tmp_path: Path) -> None:
    rows, manifest = run(vl, conversations(pictures)[:1], tmp_path, "--images", "reference")
    image = rows["images"][0][0]
    assert image["bytes"] is None and image["path"] == str(pictures / "wide.jpg")
    assert rows["image_sha256"][0][0] == hashlib.sha256((pictures / "wide.jpg").read_bytes()).hexdigest()
    assert manifest["images"]["mode"] == "reference" and manifest["images"]["processor"] == "Qwen2VLImageProcessor"


def test_bad_images_are_rejected_with_reasons_and_the_counts_add_up(vl: Path, pictures: Path,
                                                                   tmp_path: Path) -> None:
    (pictures / "broken.png").write_text("not an image")
    (pictures / "thin.png").write_bytes(image_bytes((2, 500)))  # aspect ratio 250 > 200
    ok = {"messages": [{"role": "user", "content": "<image>Who?"}, {"role": "assistant", "content": "A cat."}],
          "images": ["img/tiny.png"]}
    bad = {"img/missing.png": "missing_image", "img/broken.png": "unreadable_image",
           "https://example.com/a.png": "remote_image", "img/thin.png": "image_size_refused"}
    records = [ok, *({**ok, "images": [ref]} for ref in bad),
               {**ok, "images": ["img/tiny.png", "img/tiny.png"]},  # two images, one placeholder
               {**ok, "images": ["img/big.png"]}]  # its 64 image tokens alone exceed S = 40
    rows, manifest = run(vl, records, tmp_path, "--seq-len", "40")
    assert rows["source_line"].to_list() == [0]
    assert rejects(tmp_path) == {1: "missing_image", 2: "unreadable_image", 3: "remote_image",
                                 4: "image_size_refused", 5: "image_count_mismatch", 6: "images_exceed_seq_len"}
    counts = manifest["counts"]
    assert counts["read"] == counts["written"] + sum(counts["rejected"].values()) + sum(counts["dropped"].values())


def test_a_text_model_rejects_images_instead_of_training_without_them(pictures: Path, tmp_path: Path) -> None:
    from tests.cache.common import train_tokenizer

    tok = train_tokenizer(tmp_path / "text" / "tokenizer.json")
    records = [{"messages": [{"role": "user", "content": "<image>Who?"}, {"role": "assistant", "content": "A."}],
                "images": ["img/tiny.png"]},
               {"messages": [{"role": "user", "content": "Who?"}, {"role": "assistant", "content": "A."}]}]
    rows, _ = run(tok.parent, records, tmp_path, "--template", "chatml")
    assert rows["source_line"].to_list() == [1] and rejects(tmp_path) == {0: "unsupported_content"}


def test_whole_turns_drop_with_their_images_and_a_cut_image_drops_the_example(vl: Path, pictures: Path,
                                                                             tmp_path: Path) -> None:
    record = {"messages": [{"role": "user", "content": "<image>Who are they?"}, {"role": "assistant", "content": "A."},
                           {"role": "user", "content": "And<image>?"}, {"role": "assistant", "content": "the mat"}],
              "images": ["img/big.png", "img/tiny.png"]}
    full, _ = run(vl, [record], tmp_path)
    n = len(full["input_ids"][0])
    rows, _ = run(vl, [record], tmp_path / "cut", "--seq-len", str(n - 10), "--image-root", str(tmp_path))
    assert rows["image_grid_thw"][0].to_list() == full["image_grid_thw"][0].to_list()[1:]  # the first turn went
    assert rows["num_turns_dropped"][0] == 2 and rows["images"][0].to_list() == full["images"][0].to_list()[1:]
    # A hard cut 22 tokens before the end falls inside the second user turn's image span (its pads).
    rows, manifest = run(vl, [record], tmp_path / "right", "--seq-len", str(n - 22), "--truncation", "right",
                         "--image-root", str(tmp_path), status=EXIT_EMPTY)
    assert rows.height == 0 and manifest["counts"]["dropped"] == {"image_cut": 1}


def test_text_that_spells_image_tokens_stays_text(vl: Path, tmp_path: Path) -> None:
    records = [{"messages": [{"role": "user", "content": f"a {PAD}{START} <image> b"},
                             {"role": "assistant", "content": "the"}]}]
    rows, _ = run(vl, records, tmp_path)
    tok = transformers.AutoTokenizer.from_pretrained(vl)
    assert not set(rows["input_ids"][0]) & set(tok.convert_tokens_to_ids([PAD, START, END]))
    assert "images" in rows.columns and rows["images"][0].to_list() == []


def test_sharegpt_placeholders_and_llavas_single_image(vl: Path, pictures: Path, tmp_path: Path) -> None:
    llava = {"conversations": [{"from": "human", "value": "<image>\nWho?"}, {"from": "gpt", "value": "A cat."}],
             "image": "img/wide.jpg"}
    (tmp_path / "c.json").write_text(json.dumps({"input": {"type": "sharegpt", "images_key": "image"}}))
    rows, _ = run(vl, [llava], tmp_path, "--config", str(tmp_path / "c.json"))
    chat = {"messages": [{"role": "user", "content": "<image>\nWho?"}, {"role": "assistant", "content": "A cat."}],
            "images": ["img/wide.jpg"]}
    assert rows["input_ids"][0].to_list() == reference(vl, chat, tmp_path)[0]


@pytest.mark.skipif(not (SHARED / "qwen2.5-vl-processor").is_dir(), reason="needs ../shared/data")
def test_llamafactory_mllm_demo_equals_the_qwen25_vl_processor(tmp_path: Path) -> None:
    demo = SHARED / "images" / "llamafactory-mllm-demo" / "mllm_demo.json"
    folder = SHARED / "qwen2.5-vl-processor"
    dst = tmp_path / "out"
    assert main(["run", str(demo), str(dst), "--tokenizer", str(folder), "--quiet"]) == 0
    rows = pl.read_parquet(dst / "data" / "train").sort("source_line")
    records = json.loads(demo.read_text())
    assert rows.height == len(records)
    for row in rows.iter_rows(named=True):
        ids, grids = reference(folder, records[row["source_line"]], demo.parent)
        assert row["input_ids"] == ids and row["image_grid_thw"] == grids


def test_parquet_with_hf_image_columns(vl: Path, pictures: Path, tmp_path: Path) -> None:
    """TRL's vision datasets: `messages` with bare image parts (`index`, null text) and `images`, a
    list of HF datasets `Image` structs holding the bytes; one more record with a single `Image`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    part = pa.struct([("type", pa.string()), ("text", pa.string()), ("index", pa.int64())])
    message = pa.struct([("role", pa.string()), ("content", pa.list_(part))])
    wide, grey = (pictures / "wide.jpg").read_bytes(), (pictures / "grey.png").read_bytes()
    messages = [[{"role": "user", "content": [{"type": "image", "text": None, "index": 0},
                                              {"type": "text", "text": "Who are they?", "index": None},
                                              {"type": "image", "text": None, "index": 1}]},
                 {"role": "assistant", "content": [{"type": "text", "text": "A cat.", "index": None}]}]]
    table = pa.table({"messages": pa.array(messages, pa.list_(message)),
                      "images": pa.array([[{"bytes": wide, "path": "wide.jpg"}, {"bytes": grey, "path": None}]],
                                         pa.list_(image))})
    pq.write_table(table, tmp_path / "vision.parquet")
    dst = tmp_path / "out"
    assert main(["run", str(tmp_path / "vision.parquet"), str(dst), "--tokenizer", str(vl), "--quiet"]) == 0
    row = pl.read_parquet(dst / "data" / "train").row(0, named=True)
    record = {"messages": [{"role": "user", "content": [{"type": "image", "image": "img/wide.jpg"},
                                                        {"type": "text", "text": "Who are they?"},
                                                        {"type": "image", "image": "img/grey.png"}]},
                           {"role": "assistant", "content": "A cat."}]}
    assert row["input_ids"] == reference(vl, record, tmp_path)[0]
    assert row["images"] == [{"bytes": wide, "path": "wide.jpg"}, {"bytes": grey, "path": None}]


@pytest.mark.skipif(not (SHARED / "qwen2.5-vl-processor").is_dir(), reason="needs ../shared/data")
def test_every_shared_image_in_multi_image_multi_turn_conversations(tmp_path: Path) -> None:
    """scikit-image's 27 files (grey, RGBA, a 24-frame GIF, a 2-page TIFF, 102x102 to 1411x1411) three
    to a conversation over two user turns; the one Pillow cannot open rejects its conversation."""
    folder = SHARED / "qwen2.5-vl-processor"
    files = sorted(p.name for p in (SHARED / "images" / "scikit-image").iterdir() if p.suffix != ".txt")
    records = [{"messages": [{"role": "user", "content": "<image><image>What are these?"},
                             {"role": "assistant", "content": "Two pictures."},
                             {"role": "user", "content": "And <image>?"}, {"role": "assistant", "content": "A third."}],
                "images": files[i:i + 3]} for i in range(0, len(files) - 2, 3)]
    rows, manifest = run(folder, records, tmp_path, "--seq-len", "32768", "--max-pixels", str(1 << 20),
                         "--image-root", str(SHARED / "images" / "scikit-image"))
    bad = {i for i, r in enumerate(records) if "multipage_rgb.tif" in r["images"]}
    assert set(rows["source_line"]) == set(range(len(records))) - bad and rejects(tmp_path) == {
        i: "unreadable_image" for i in bad}
    proc = transformers.Qwen2VLImageProcessorPil.from_pretrained(folder, max_pixels=1 << 20)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    for row in rows.iter_rows(named=True):
        record = records[row["source_line"]]
        images = [transformers.image_utils.load_image(str(SHARED / "images" / "scikit-image" / f))
                  for f in record["images"]]
        grids = proc(images=images, return_tensors="np")["image_grid_thw"]
        parts = [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "What are these?"}]
        text = tok.apply_chat_template([{"role": "user", "content": parts}, record["messages"][1],
                                        {"role": "user", "content": [{"type": "text", "text": "And "}, {"type": "image"},
                                                                     {"type": "text", "text": "?"}]},
                                        record["messages"][3]], tokenize=False)
        pieces = text.split(PAD)
        text = pieces[0] + "".join(PAD * int(g.prod() // 4) + p for g, p in zip(grids, pieces[1:], strict=True))
        assert row["input_ids"] == tok(text, add_special_tokens=False)["input_ids"]
        assert row["image_grid_thw"] == grids.tolist()
    assert manifest["counts"]["read"] == rows.height + len(bad)


def test_image_sizes_are_as_load_image_sees_them(vl: Path, pictures: Path, tmp_path: Path) -> None:
    from transformers.image_utils import load_image

    rows, _ = run(vl, conversations(pictures)[1:3], tmp_path)
    for row in rows.iter_rows(named=True):
        files = image_files(conversations(pictures)[1:3][row["source_line"]], tmp_path)
        assert row["image_sizes"] == [list(load_image(f).size) for f in files]  # turned.jpg: 40 x 120


def test_dedup_keys_hold_the_images(vl: Path, pictures: Path, tmp_path: Path) -> None:
    """The same text over another image is kept; over the same image it is a duplicate."""
    one = {"messages": [{"role": "user", "content": "<image>Who?"}, {"role": "assistant", "content": "A cat."}],
           "images": ["img/tiny.png"]}
    records = [one, {**one, "images": ["img/wide.jpg"]}, one]
    (tmp_path / "c.json").write_text(json.dumps({"preprocessing": {"deduplicate": True}}))
    rows, manifest = run(vl, records, tmp_path, "--config", str(tmp_path / "c.json"))
    assert rows["source_line"].to_list() == [0, 1] and manifest["counts"]["dropped"] == {"duplicate": 1}


def test_embedded_bytes_are_read_again_per_part_and_checked(vl: Path, pictures: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts of at most IMAGE_BYTES_PER_PART of image files, each file read again when its part is
    written; the rows are those of one part; a file changed between the reads stops the run."""
    from etl.errors import EtlError
    from etl.images.embed import read_again
    from etl.pipeline import images

    records = conversations(pictures)
    whole, _ = run(vl, records, tmp_path / "whole", "--image-root", str(tmp_path))
    monkeypatch.setattr(images, "IMAGE_BYTES_PER_PART", 1)  # a part per example with images
    parts, _ = run(vl, records, tmp_path / "parts", "--image-root", str(tmp_path))
    assert len(list((tmp_path / "parts" / "out" / "data" / "train").iterdir())) == len(records)
    assert parts.drop("id", "source_file").equals(whole.drop("id", "source_file"))
    files = [str(pictures / "tiny.png"), str(pictures / "wide.jpg")]
    shas = [hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in files]
    sizes = [Path(f).stat().st_size for f in files]
    assert read_again(files, shas, sizes).to_pylist() == [Path(f).read_bytes() for f in files]
    (pictures / "tiny.png").write_bytes(image_bytes((11, 10)))  # another size
    with pytest.raises(EtlError, match="changed while etl run read it"):
        read_again(files, shas, sizes)
    (pictures / "tiny.png").write_bytes(bytes(sizes[0]))  # the same size, other bytes
    with pytest.raises(EtlError, match="changed while etl run read it"):
        read_again(files, shas, sizes)


def test_text_input_runs_with_a_vision_processor(vl: Path, tmp_path: Path) -> None:
    """Input types whose messages carry no image offsets (text) run under a processor folder as
    under its tokenizer alone, with empty image columns."""
    records = [{"text": "the of and to in is the of and to in is the of and to in is the of and"}]
    rows, _ = run(vl, records, tmp_path, "--input-type", "text")
    assert rows.height == 1 and rows["images"][0].to_list() == [] and rows["num_image_tokens"][0] == 0
