"""read_images: every kind of reference, its size as transformers' load_image sees it (EXIF
orientation included) read from the header without decoding, and one-line rejects."""

from __future__ import annotations

import base64
import hashlib
import io
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile, UnidentifiedImageError

from etl.images.read import (
    MISSING,
    REMOTE,
    SCHEMA,
    UNREADABLE,
    decode_rgb,
    header_size,
    read_images,
)
from tests.ingest.s3_server import S3, s3_server

load_image = pytest.importorskip("transformers.image_utils").load_image

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "images"


def png(size: tuple[int, int] = (40, 20), **save: object) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, "teal").save(buffer, "PNG", **save)
    return buffer.getvalue()


def exif(orientation: int) -> Image.Exif:
    tags = Image.Exif()
    tags[0x0112] = orientation
    return tags


def saved(fmt: str, orientation: int, **save: object) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (40, 20), "teal").save(buffer, fmt, **save)
    return buffer.getvalue()


def png_tail_chunk(kind: bytes, payload: bytes) -> bytes:
    """A PNG with one more chunk after its image data (Pillow reads it only when it loads)."""
    data = png()
    chunk = struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))
    end = data.rfind(b"IEND") - 4
    return data[:end] + chunk + data[end:]


# Every place an orientation can sit, per format: how the file is made from an orientation.
ORIENTED: dict[str, Callable[[int], bytes]] = {
    "jpeg-exif": lambda o: saved("JPEG", o, exif=exif(o).tobytes()),
    "png-exif-before-data": lambda o: png(exif=exif(o)),
    "png-exif-after-data": lambda o: png_tail_chunk(b"eXIf", exif(o).tobytes()[6:]),
    "png-xmp-after-data": lambda o: png_tail_chunk(
        b"iTXt", b"XML:com.adobe.xmp\0\0\0\0\0" + f'<x tiff:Orientation="{o}"/>'.encode()),
    "tiff-tag": lambda o: saved("TIFF", o, tiffinfo={274: o}),
    "webp-exif": lambda o: saved("WEBP", o, exif=exif(o)),
}


def forbid_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on any file plugin's load() (what decodes pixels) fails the test."""
    def decoded(self: Image.Image) -> None:
        raise AssertionError(f"{self.format} pixels decoded")

    Image.init()
    for factory, _ in Image.OPEN.values():
        for cls in getattr(factory, "__mro__", ()):
            if "load" in vars(cls) and issubclass(cls, ImageFile.ImageFile):
                monkeypatch.setattr(cls, "load", decoded)


def loaded_size(tmp_path: Path, data: bytes, name: str = "image") -> tuple[int, int]:
    """load_image's (width, height) of these bytes, from a file as transformers opens it."""
    path = tmp_path / name
    path.write_bytes(data)
    return load_image(str(path)).size


@pytest.mark.parametrize("kind", sorted(ORIENTED))
def test_orientation_turns_the_size_as_load_image_does(kind: str, tmp_path: Path) -> None:
    made = {o: ORIENTED[kind](o) for o in range(1, 9)}
    expected = {o: loaded_size(tmp_path, data) for o, data in made.items()}
    assert {expected[o] for o in (5, 6, 7, 8)} == {(20, 40)} and expected[3] == (40, 20)
    assert {o: header_size(data) for o, data in made.items()} == expected


def test_sizes_are_read_without_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    made = {kind: ORIENTED[kind](6) for kind in ORIENTED}
    refs = [png(), ORIENTED["jpeg-exif"](8)]
    forbid_decoding(monkeypatch)
    with pytest.raises(AssertionError, match="PNG pixels decoded"):  # the check bites
        Image.open(io.BytesIO(refs[0])).load()
    assert {kind: header_size(data) for kind, data in made.items()} == dict.fromkeys(made, (20, 40))
    table = read_images(refs, base=None, root=None, keep_bytes=False)
    assert table.select(["width", "height"]).to_pylist() == [{"width": 40, "height": 20}, {"width": 20, "height": 40}]


def test_decode_rgb_is_load_image(tmp_path: Path) -> None:
    data = ORIENTED["jpeg-exif"](6)
    (tmp_path / "x.jpg").write_bytes(data)
    mine, theirs = decode_rgb(data), load_image(str(tmp_path / "x.jpg"))
    assert mine.mode == theirs.mode == "RGB" and mine.size == theirs.size == (20, 40)
    assert np.array_equal(np.asarray(mine), np.asarray(theirs))


def test_every_kind_of_reference(tmp_path: Path) -> None:
    data = png((30, 10))
    (tmp_path / "data" / "img").mkdir(parents=True)
    (tmp_path / "media" / "img").mkdir(parents=True)
    (tmp_path / "data" / "img" / "a.png").write_bytes(data)
    (tmp_path / "media" / "img" / "a.png").write_bytes(png((8, 6)))
    uri = "data:image/png;base64," + base64.b64encode(data).decode()
    refs = ["img/a.png", str(tmp_path / "data" / "img" / "a.png"), (tmp_path / "data" / "img" / "a.png").as_uri(),
            uri, data, bytearray(data), {"bytes": data, "path": "named.png"}, {"bytes": None, "path": "img/a.png"}]
    table = read_images(refs, base=str(tmp_path / "data"), root=None, keep_bytes=True)
    assert table.schema == SCHEMA
    rows = table.to_pylist()
    assert [(r["width"], r["height"], r["reason"], r["detail"]) for r in rows] == [(30, 10, None, None)] * len(refs)
    assert [r["path"] for r in rows] == [*refs[:3], None, None, None, "named.png", "img/a.png"]
    assert [r["location"] is None for r in rows] == [r["path"] is None or r["path"] == "named.png" for r in rows]
    assert {r["sha256"] for r in rows} == {hashlib.sha256(data).hexdigest()}
    assert all(r["bytes"] == data for r in rows)
    rooted = read_images(["img/a.png"], base=str(tmp_path / "data"), root=str(tmp_path / "media"), keep_bytes=False)
    assert rooted.to_pylist()[0] | {"sha256": None} == {  # root wins over base
        "width": 8, "height": 6, "bytes": None, "path": "img/a.png", "sha256": None, "reason": None, "detail": None,
        "location": str(tmp_path / "media" / "img" / "a.png"),  # where `--images reference` reads it again
        "size": len(png((8, 6)))}
    assert rooted["sha256"][0].as_py() == hashlib.sha256(png((8, 6))).hexdigest()  # kept when bytes are not
    as_uri = read_images(["img/a.png"], base=(tmp_path / "data").as_uri(), root=None, keep_bytes=False)
    assert as_uri["width"].to_pylist() == [30]


def test_rejects_say_why_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "x.png").write_text("not an image", encoding="utf-8")
    (tmp_path / "folder.png").mkdir()
    refs = ["https://example.com/a.jpg", "HTTP://example.com/b.jpg", "a/b.jpg", "x.png", "folder.png",
            "data:image/png;base64,bm90IGFuIGltYWdl", "data:text/plain,hi", "file://host/x.png",
            {"bytes": None, "path": None}, None, 7, b"\x89PNG"]
    rows = read_images(refs, base=str(tmp_path), root=None, keep_bytes=True).to_pylist()
    assert [r["reason"] for r in rows] == [REMOTE, REMOTE, MISSING, UNREADABLE, MISSING, UNREADABLE, UNREADABLE,
                                           UNREADABLE, MISSING, MISSING, UNREADABLE, UNREADABLE]
    assert all(r["width"] is None and r["bytes"] is None and "\n" not in r["detail"] for r in rows)
    detail = [r["detail"] for r in rows]
    assert detail[0] == ("image 'https://example.com/a.jpg': remote images are not downloaded during a run; "
                         "download them first and give local paths (or s3://, gs://... URIs)")
    assert detail[2] == f"image 'a/b.jpg': no such file (resolved to {tmp_path / 'a' / 'b.jpg'})"
    assert detail[3] == "image 'x.png': not an image Pillow can open (no image format Pillow reads)"
    assert "is a folder" in detail[4] and "file:///absolute/path" in detail[7]
    assert detail[11] == "image <4 bytes>: not an image Pillow can open (no image format Pillow reads)"
    assert [r["path"] for r in rows[:5]] == refs[:5] and rows[5]["path"] is None
    assert rows[3]["sha256"] == hashlib.sha256(b"not an image").hexdigest() and rows[2]["sha256"] is None


def test_many_references_keep_their_order(tmp_path: Path) -> None:
    sizes = [(w, 1 + w % 7) for w in range(1, 120)]
    for w, h in sizes:
        (tmp_path / f"{w}.png").write_bytes(png((w, h)))
    refs = [f"{w}.png" for w, _ in sizes]
    for threads in (1, 8):
        table = read_images(refs, base=str(tmp_path), root=None, keep_bytes=False, threads=threads)
        assert list(zip(table["width"].to_pylist(), table["height"].to_pylist())) == sizes
    empty = read_images([], base=None, root=None, keep_bytes=False)
    assert empty.num_rows == 0 and empty.schema == SCHEMA


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    with s3_server(tmp_path_factory.mktemp("aws")) as server:
        yield server


def test_object_store_references(s3: S3, tmp_path: Path) -> None:
    (tmp_path / "imgs" / "sub dir").mkdir(parents=True)
    (tmp_path / "imgs" / "sub dir" / "a.png").write_bytes(png((12, 34)))
    s3.upload(tmp_path / "imgs", "imgs")
    refs = [s3.uri("imgs/sub%20dir/a.png"), "sub dir/a.png", "sub dir/absent.png"]
    rows = read_images(refs, base=s3.uri("imgs"), root=None, keep_bytes=False).to_pylist()
    assert [(r["width"], r["height"], r["reason"]) for r in rows] == [(12, 34, None), (12, 34, None),
                                                                     (None, None, MISSING)]
    assert rows[2]["detail"].startswith("image 'sub dir/absent.png': no such object (s3://")


@pytest.mark.shared
@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is absent")
def test_shared_images_have_load_image_sizes() -> None:
    """The 27 scikit-image files (every mode, a 24-frame GIF, a 2-page TIFF) and the 3 demo JPEGs;
    multipage_rgb.tif is one Pillow (so load_image) cannot open."""
    paths = sorted(p for p in SHARED.rglob("*") if p.suffix in {".png", ".jpg", ".gif", ".tif"})
    assert len(paths) == 30
    rows = read_images([str(p) for p in paths], base=None, root=None, keep_bytes=False).to_pylist()
    for path, row in zip(paths, rows):
        if path.name == "multipage_rgb.tif":
            assert row["reason"] == UNREADABLE and row["sha256"] is not None
            with pytest.raises(UnidentifiedImageError):
                load_image(str(path))
        else:
            assert (row["width"], row["height"]) == load_image(str(path)).size, path.name
            assert row["reason"] is None and row["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
