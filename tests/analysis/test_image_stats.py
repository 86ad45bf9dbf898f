"""`etl stats` / `etl report` of an image run's output: images per example, image-token share,
long sides and tokens per image against sizes and grids worked out by hand for made images; image
rejects and the `image_cut` drop listed; text and pair outputs get none of it.

Grids by hand (`make_vl_folder`: 14-pixel patches merged 2 x 2, so sides round to multiples of 28;
at most 64 * 28 * 28 = 50,176 pixels; tokens = t*h*w / 4):
  56x56 -> [1, 4, 4], 4 tokens; 112x56 -> [1, 4, 8], 8; 224x112 -> [1, 8, 16], 32;
  196x252 -> [1, 18, 14], 63; 300x200 rounds to 308x196 = 60,368 pixels > 50,176, so both sides
  shrink by sqrt(60,000 / 50,176) = 1.0935 and round down: 252x168 -> [1, 12, 18], 54.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from etl.analysis.report import build_report
from etl.analysis.stats import IMAGE_QUERIES, query_names, run_queries, run_query
from etl.cli import main
from etl.errors import EXIT_EMPTY, EtlError
from tests.analysis.recount import keyed
from tests.analysis.test_stats_report import assert_not_blank, decode
from tests.images.vl_folder import image_bytes, make_vl_folder

SIZES = {"a.png": (56, 56), "b.png": (112, 56), "c.png": (224, 112), "d.png": (196, 252),
         "e.png": (300, 200)}
TOKENS = {"a.png": 4, "b.png": 8, "c.png": 32, "d.png": 63, "e.png": 54}
GRIDS = {"a.png": [1, 4, 4], "b.png": [1, 4, 8], "c.png": [1, 8, 16], "d.png": [1, 18, 14],
         "e.png": [1, 12, 18]}


def user(*parts: str) -> dict[str, Any]:
    """A user turn of TRL image parts (`img/<name>`) and text."""
    content = [{"type": "image", "image": f"img/{p}"} if p.endswith(".png") else {"type": "text", "text": p}
               for p in parts]
    return {"role": "user", "content": content}


def answer(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


# Images per example 1, 2, 0, 2, 1; image a twice (5 distinct images of 6).
RECORDS = [
    {"messages": [user("a.png", "What is in the picture?"), answer("A cat on a mat.")]},
    {"messages": [user("b.png", "c.png", "Who are they?"), answer("the of and")]},
    {"messages": [{"role": "user", "content": "Who are they?"}, answer("A cat.")]},
    {"messages": [{"role": "user", "content": "<image>Who are they?"}, answer("A cat."),
                  {"role": "user", "content": "And this<image>?"}, answer("the mat")],
     "images": ["img/d.png", "img/e.png"]},
    {"messages": [user("a.png", "Who is it?"), answer("A cat.")]},
]
IMAGES_OF = [["a.png"], ["b.png", "c.png"], [], ["d.png", "e.png"], ["a.png"]]


def etl_run(root: Path, records: list[dict[str, Any]], out: Path, *args: str, status: int = 0) -> Path:
    """`etl run` over `records` (one JSON line each) with root's processor folder and images; DST."""
    src = out.parent / f"{out.name}.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    argv = ["run", str(src), str(out), "--tokenizer", str(root / "processor"), "--image-root", str(root)]
    assert main([*argv, "--quiet", *args]) == status
    return out


def write_images(folder: Path) -> Path:
    """The made images under folder/img: SIZES, a broken file and a 2x500 strip (aspect 250)."""
    (folder / "img").mkdir(parents=True, exist_ok=True)
    for name, size in {**SIZES, "thin.png": (2, 500)}.items():
        (folder / "img" / name).write_bytes(image_bytes(size))
    (folder / "img" / "broken.png").write_text("not an image")
    return folder


@pytest.fixture(scope="module")
def vl_dst(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An image run over RECORDS."""
    root = write_images(tmp_path_factory.mktemp("vl"))
    make_vl_folder(root / "processor")
    return etl_run(root, RECORDS, root / "out")


def data_rows(dst: Path) -> list[dict[str, Any]]:
    import polars as pl

    return pl.read_parquet(dst / "data" / "train").sort("source_line").to_dicts()


def test_the_run_has_the_hand_worked_grids(vl_dst: Path) -> None:
    rows = data_rows(vl_dst)
    assert [r["image_grid_thw"] for r in rows] == [[GRIDS[n] for n in names] for names in IMAGES_OF]
    assert [r["image_sizes"] for r in rows] == [[list(SIZES[n]) for n in names] for names in IMAGES_OF]
    assert [r["num_image_tokens"] for r in rows] == [sum(TOKENS[n] for n in names) for names in IMAGES_OF] \
        == [4, 40, 0, 117, 4]


def test_images(vl_dst: Path) -> None:
    tokens = sum(r["num_tokens"] for r in data_rows(vl_dst))
    got = keyed(run_query(vl_dst, "images"), "split")
    assert list(got) == ["train", "(all)"]
    for row in got.values():
        assert row == {"split": row["split"], "examples": 5, "examples_with_images": 4, "images": 6,
                       "distinct_images": 5, "tokens": tokens, "image_tokens": 165,
                       "image_tokens_in_grids": 165, "image_token_share": round(165 / tokens, 4),
                       "mean_example_share": row["mean_example_share"]}
    shares = [r["num_image_tokens"] / r["num_tokens"] for r in data_rows(vl_dst) if r["num_image_tokens"]]
    assert got["train"]["mean_example_share"] == pytest.approx(sum(shares) / 4, abs=5e-5)


def test_images_per_example(vl_dst: Path) -> None:
    got = [(r["split"], r["images"], r["examples"], r["image_tokens"])
           for r in run_query(vl_dst, "images_per_example").to_pylist()]
    assert got == [("train", 0, 1, 0), ("train", 1, 2, 8), ("train", 2, 2, 157)]


def test_image_share_histogram(vl_dst: Path) -> None:
    got = run_query(vl_dst, "image_share_histogram").to_pylist()
    assert [(r["percent_from"], r["percent_to"]) for r in got] == [(p, p + 10) for p in range(0, 100, 10)]
    bins = [0] * 10
    for r in data_rows(vl_dst):
        if r["num_image_tokens"]:  # the example without images is not in this histogram
            bins[min(int(100 * r["num_image_tokens"] / r["num_tokens"]) // 10, 9)] += 1
    assert [r["examples"] for r in got] == bins and sum(bins) == 4


def test_image_sizes(vl_dst: Path) -> None:
    got = [(r["long_side_from"], r["long_side_to"], r["images"], r["mean_width"], r["mean_height"],
            r["mean_megapixels"], r["image_tokens"]) for r in run_query(vl_dst, "image_sizes").to_pylist()]
    assert got == [
        (32, 64, 2, 56.0, 56.0, 0.0031, 8),  # a twice: 3,136 pixels
        (64, 128, 1, 112.0, 56.0, 0.0063, 8),  # b: 6,272
        (128, 256, 2, 210.0, 182.0, 0.0372, 95),  # c, d: (25,088 + 49,392) / 2
        (256, 512, 1, 300.0, 200.0, 0.06, 54),  # e
    ]


def test_image_tokens(vl_dst: Path) -> None:
    got = [(r["tokens_from"], r["tokens_to"], r["images"], r["tokens"])
           for r in run_query(vl_dst, "image_tokens").to_pylist()]
    assert got == [(4, 8, 2, 8), (8, 16, 1, 8), (16, 32, 0, 0), (32, 64, 3, 149)]


def test_image_queries_follow_the_splits(vl_dst: Path, tmp_path: Path) -> None:
    import polars as pl

    (tmp_path / "split.toml").write_text("[split]\nval_fraction = 0.5\n")
    out = etl_run(vl_dst.parent, RECORDS, tmp_path / "split", "--config", str(tmp_path / "split.toml"))
    rows = data_rows(out) + pl.read_parquet(out / "data" / "val").to_dicts()
    per_split = keyed(run_query(out, "images"), "split")
    for split in ("train", "val"):
        mine = [r for r in rows if r["split"] == split]
        assert per_split[split]["images"] == sum(len(r["image_grid_thw"]) for r in mine)
    assert per_split["(all)"]["images"] == 6
    tokens = run_query(out, "image_tokens").to_pylist()
    assert sum(r["images"] for r in tokens) == 6 and {r["split"] for r in tokens} == {"train", "val"}


def test_image_rejects_and_the_image_cut_drop_show(vl_dst: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    ok = {"messages": [{"role": "user", "content": "<image>Who?"}, answer("A cat.")], "images": ["img/a.png"]}
    bad = {"img/missing.png": "missing_image", "img/broken.png": "unreadable_image",
           "https://example.com/a.png": "remote_image", "img/thin.png": "image_size_refused"}
    records = [ok, *({**ok, "images": [ref]} for ref in bad),  # ok: 64 tokens
               {**ok, "images": ["img/a.png", "img/a.png"]},  # two images, one placeholder
               # d's and e's 63 + 54 image tokens alone exceed S = 70
               {**ok, "messages": [{"role": "user", "content": "<image><image>Who?"}, answer("A cat.")],
                "images": ["img/d.png", "img/e.png"]},
               # c's span is tokens [48, 81] of its 100: the right cut at S = 70 falls inside it
               {"messages": [user("Who are they? What is in the picture?", "c.png"), answer("A cat.")]}]
    out = etl_run(vl_dst.parent, records, tmp_path / "bad", "--seq-len", "70", "--truncation", "right")
    reasons = {*bad.values(), "image_count_mismatch", "images_exceed_seq_len"}
    rejects = keyed(run_query(out, "rejects"), "reason")
    assert set(rejects) == reasons and {r["rejects"] for r in rejects.values()} == {1}
    assert "missing.png" in rejects["missing_image"]["first_detail"]
    drops = {(r["stage"], r["reason"]): (r["manifest"], r["observed"])
             for r in run_query(out, "drops").to_pylist()}
    assert drops[("dropped", "image_cut")] == (1, None)
    assert all(drops[("rejected", reason)] == (1, 1) for reason in reasons)
    assert (drops[("written", None)], drops[("accounting_gap", None)]) == ((1, 1), (0, None))
    assert main(["stats", str(out), "--query", "rejects", "--query", "drops"]) == 0
    printed = capsys.readouterr().out
    assert all(reason in printed for reason in [*reasons, "image_cut"])
    html = build_report(out)
    assert all(reason in html for reason in [*reasons, "image_cut"])


def test_an_image_run_that_wrote_nothing_still_has_its_tables(vl_dst: Path, tmp_path: Path) -> None:
    record = {"messages": [{"role": "user", "content": "<image>Who?"}, answer("A.")], "images": ["img/no.png"]}
    out = etl_run(vl_dst.parent, [record], tmp_path / "none", status=EXIT_EMPTY)
    results = run_queries(out)
    assert {name: results[name].num_rows for name in IMAGE_QUERIES} == {
        "images": 1, "images_per_example": 0, "image_share_histogram": 0, "image_sizes": 0, "image_tokens": 0}
    assert results["images"].to_pylist()[0]["images"] == 0
    assert len(decode(build_report(out))) == 8


def test_stats_lists_and_prints_the_image_tables(vl_dst: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", str(vl_dst), "--query", "list"]) == 0
    listed = capsys.readouterr().out.split()
    assert listed == query_names(images=True) and set(IMAGE_QUERIES) <= set(listed)
    assert main(["stats", str(vl_dst), "--format", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert list(printed) == listed
    assert main(["stats", str(vl_dst), "--query", "image_tokens"]) == 0
    table = capsys.readouterr().out
    bars = [line.count("█") for line in table.splitlines() if "│" in line]
    assert bars == [round(40 * n / 3) for n in (2, 1)] + [0, 40]  # one text bar per bin, the largest 40


def test_report_has_the_image_plots_and_tables(vl_dst: Path) -> None:
    html = build_report(vl_dst)
    images = decode(html)
    assert len(images) == 8  # the four of every output, then the four image plots
    for image in images[4:]:
        assert_not_blank(image)
    for title in ("Images per example", "Image-token share per example", "Image sizes (long side)",
                  "Tokens per image"):
        assert f'alt="{title}"' in html
    assert '<h2 id="images">' in html and '<h2 id="image_sizes">' in html
    assert '<h2 id="image_tokens">' not in html  # plotted only
    assert "<dt>images</dt><dd>Qwen2VLImageProcessor: patch 14, merge 2, pixels 3,136–50,176 (embed)" in html


def test_text_and_pair_outputs_get_no_image_queries(dst: Path, pref: Path, kto: Path) -> None:
    assert not set(IMAGE_QUERIES) & set(query_names())
    assert not set(IMAGE_QUERIES) & set(run_queries(dst))
    for pair in (pref, kto):
        assert not set(IMAGE_QUERIES) & set(run_queries(pair))
        kind = json.loads((pair / "_manifest.json").read_text())["kind"]
        assert not set(IMAGE_QUERIES) & set(query_names(kind, images=True))
    with pytest.raises(EtlError, match="unknown query 'image_sizes' for an output without images"):
        run_query(dst, "image_sizes")
    html = build_report(dst)
    assert len(decode(html)) == 4 and "Images per example" not in html and "<dt>images</dt>" not in html
