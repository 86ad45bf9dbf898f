"""Where an image is, and its size as transformers' `load_image` sees it, from the file's header.

A reference is what a record holds: a path (relative ones against `root`, else the data file's
folder `base`, as LLaMA-Factory joins its media folder), a `file://` or object-store URI
(`s3://`, `gs://`, ... through pyarrow.fs), a `data:image/...;base64,` URI, raw bytes, or a Hugging
Face datasets Image dict `{"bytes", "path"}`. Nothing is downloaded during a run: `http(s)://`
is refused. `load_image` opens the first frame, turns it by its EXIF orientation and converts it
to RGB; the size that results is read here without decoding a pixel (Pillow's `Image.open` reads
the header only; orientations 5-8 swap width and height).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import struct
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
from PIL import ExifTags, Image, ImageOps, PngImagePlugin, TiffImagePlugin, UnidentifiedImageError

from etl.errors import EtlError
from etl.ingest.discover import is_uri
from etl.ingest.location import checks, display, filesystem, scheme

REMOTE, MISSING, UNREADABLE = "remote_image", "missing_image", "unreadable_image"  # reject reasons
SCHEMA = pa.schema([("width", pa.int32()), ("height", pa.int32()), ("bytes", pa.binary()),
                    ("path", pa.string()), ("sha256", pa.string()), ("reason", pa.string()),
                    ("detail", pa.string()), ("location", pa.string()), ("size", pa.int64())])
INLINE = "inline"  # read_images' keep_bytes: keep the bytes of images that have no location (data URIs, bytes)
# EXIF orientations that transpose the image (ImageOps.exif_transpose: TRANSPOSE, ROTATE_270,
# TRANSVERSE, ROTATE_90): load_image's width is the file's height.
TRANSPOSED = frozenset({5, 6, 7, 8})
# PNG chunks after the image data that Pillow's load() reads into `info` and that can carry an
# orientation (EXIF, or XMP in text): exif_transpose loads before it looks.
_PNG_TAIL = frozenset({b"eXIf", b"tEXt", b"zTXt", b"iTXt"})
_DATA_URI = "data:image/"  # the prefix load_image decodes as base64; any other data: is not an image
_SHOWN = 60  # characters of a data URI a detail shows


class Reject(Exception):
    """A reference that gives no image: its reason and one-line detail."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


class _Found(NamedTuple):
    """A reference's bytes, its `path` column (the path as written; None for bytes) and where it was
    read (`location`: the absolute path or URI; None for bytes and data URIs)."""

    data: bytes
    path: str | None
    location: str | None = None


def decode_rgb(data: bytes) -> Image.Image:
    """The image as transformers' `load_image` returns it: first frame, EXIF-transposed, RGB."""
    image = Image.open(io.BytesIO(data))
    return ImageOps.exif_transpose(image).convert("RGB")


def header_size(data: bytes) -> tuple[int, int]:
    """(width, height) of `decode_rgb(data)`, from the header: no pixel is decoded.

    Raises:
        Exception: whatever Pillow raises for data it cannot open (`UnidentifiedImageError`, ...).
    """
    with Image.open(io.BytesIO(data)) as image:
        if isinstance(image, PngImagePlugin.PngImageFile):
            _png_tail(image, data)
        # Image.Image's getexif, not PNG's: that one decodes the image to reach the tail chunks.
        orientation = Image.Image.getexif(image).get(ExifTags.Base.Orientation, 1)
        width, height = image.size
        if isinstance(image, TiffImagePlugin.TiffImageFile):
            # Pillow 13 reports a TIFF's size already turned by orientations 5-8 (its load turns
            # the pixels and drops the tag); the stored size, turned below, is right in any Pillow.
            tags = image.tag_v2
            width, height = tags[TiffImagePlugin.IMAGEWIDTH], tags[TiffImagePlugin.IMAGELENGTH]
    return (height, width) if orientation in TRANSPOSED else (width, height)


def _png_tail(image: PngImagePlugin.PngImageFile, data: bytes) -> None:
    """Add to `image.info` what Pillow's `load_end` reads after the image data (EXIF and text
    chunks), skipping the compressed data instead of inflating it; stops where it stops."""
    stream = PngImagePlugin.PngStream(io.BytesIO(data))
    stream.im_info = image.info  # the chunk handlers write here, as they do for `load_end`
    assert stream.fp is not None
    stream.fp.seek(image.tile[0].offset - 8)  # the first image-data chunk's header
    while True:
        try:
            cid, _, length = stream.read()
        except (struct.error, SyntaxError):  # truncated after the data: load_end stops too
            return
        if cid == b"IEND" or (cid == b"fcTL" and image.is_animated):
            return
        if cid in _PNG_TAIL:
            try:
                stream.call(cid, 0, length)
            except UnicodeDecodeError:
                return
        else:
            stream.fp.seek(length, os.SEEK_CUR)
        stream.fp.read(4)  # CRC


def _name(ref: Any) -> str:
    """How a detail names a reference: the path or URI as written, a data URI cut short."""
    if isinstance(ref, str):
        return repr(display(ref[:_SHOWN] + "..." if ref.startswith("data:") and len(ref) > _SHOWN
                            else ref))
    if isinstance(ref, (bytes, bytearray, memoryview)):
        return f"<{len(ref)} bytes>"
    if isinstance(ref, Mapping):
        return _name(ref.get("path") or ref.get("bytes"))
    return f"<{type(ref).__name__}>"


def read_uri(uri: str, written: str) -> bytes:
    """The object `uri` names, through pyarrow.fs; one client per store (bucket or host, with the
    URI's options), made once per process by `etl.ingest.location.filesystem`."""
    parts = urllib.parse.urlsplit(uri)
    store = urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/", parts.query, ""))
    try:
        fs, root = filesystem(store, what="image")
    except EtlError as exc:
        raise Reject(UNREADABLE, f"image {_name(written)}: {exc}") from exc
    path = root.rstrip("/") + "/" + urllib.parse.unquote(parts.path).lstrip("/")
    try:
        with fs.open_input_file(path) as file:
            return file.readall()
    except FileNotFoundError as exc:
        raise Reject(MISSING, f"image {_name(written)}: no such object ({display(uri)})") from exc
    except OSError as exc:
        reason = display((str(exc).strip().splitlines() or [type(exc).__name__])[0])
        raise Reject(UNREADABLE, f"image {_name(written)}: cannot read {display(uri)} ({reason}); "
                                  f"check {checks(uri)}") from exc


def read_file(path: str, written: str) -> bytes:
    """A local file's bytes; `written` is the reference as the record gave it."""
    try:
        with open(path, "rb") as file:
            return file.read()
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise Reject(MISSING, f"image {_name(written)}: no such file (resolved to {path})") from exc
    except IsADirectoryError as exc:
        raise Reject(MISSING, f"image {_name(written)}: {path} is a folder, not a file") from exc
    except OSError as exc:
        raise Reject(UNREADABLE, f"image {_name(written)}: cannot read {path} "
                                  f"({exc.strerror or exc})") from exc


def _local(uri: str, written: str) -> str:
    """The path of a `file://` URI (`file:///abs/path`; a host other than localhost refused)."""
    parts = urllib.parse.urlsplit(uri)
    if parts.netloc not in ("", "localhost"):
        raise Reject(UNREADABLE, f"image {_name(written)}: a file URI names a host "
                                  f"({parts.netloc!r}); write file:///absolute/path")
    return urllib.request.url2pathname(parts.path)


def _resolve(ref: str, base: str | None, root: str | None) -> str:
    """Where a path or URI reference is: a local path, or a URI read through pyarrow.fs. A
    relative path is joined to `root`, else `base`, else the current folder."""
    if is_uri(ref):
        return _local(ref, ref) if scheme(ref) == "file" else ref
    if os.path.isabs(ref):
        return ref
    folder = root if root is not None else base
    if folder is not None and is_uri(folder):
        if scheme(folder) == "file":
            folder = _local(folder, ref)
        else:  # inside the folder's URI, its options kept
            parts = urllib.parse.urlsplit(folder)
            path = parts.path.rstrip("/") + "/" + urllib.parse.quote(ref)
            return urllib.parse.urlunsplit(parts._replace(path=path))
    return os.path.abspath(os.path.join(folder or os.curdir, ref))


def _from_text(ref: str, base: str | None, root: str | None) -> bytes:
    """The bytes a string reference names: a data URI, a URI, or a path."""
    lowered = ref[:16].lower()
    if lowered.startswith(("http://", "https://")):
        raise Reject(REMOTE, f"image {_name(ref)}: remote images are not downloaded during a run; "
                              "download them first and give local paths (or s3://, gs://... URIs)")
    if lowered.startswith("data:"):
        if not lowered.startswith(_DATA_URI):
            raise Reject(UNREADABLE, f"image {_name(ref)}: a data URI that is not data:image/...")
        try:  # load_image: the text after the first comma, base64.decodebytes (lenient)
            return base64.decodebytes(ref.split(",", 2)[1].encode())
        except (IndexError, ValueError) as exc:
            raise Reject(UNREADABLE, f"image {_name(ref)}: not base64 ({exc})") from exc
    where = _resolve(ref, base, root)
    return read_uri(where, ref) if is_uri(where) else read_file(where, ref)


def _locate(ref: Any, base: str | None, root: str | None) -> _Found:
    """The bytes of one reference and its `path` column; `Reject` when there are none."""
    if isinstance(ref, Mapping):  # Hugging Face datasets' Image: bytes win over the path
        data, path = ref.get("bytes"), ref.get("path")
        if data is not None:
            return _locate(data, base, root)._replace(path=_text(path), location=None)
        if path is None:
            raise Reject(MISSING, "image {bytes: null, path: null}: neither bytes nor a path")
        return _locate(path, base, root)
    if isinstance(ref, (bytes, bytearray, memoryview)):
        return _Found(bytes(ref), None)
    if isinstance(ref, str):
        path = _text(ref)
        return _Found(_from_text(ref, base, root), path, path and _resolve(ref, base, root))
    if ref is None:
        raise Reject(MISSING, "image null: no reference")
    raise Reject(UNREADABLE, f"image {_name(ref)}: not a path, URI, bytes or {{bytes, path}}")


def _text(path: Any) -> str | None:
    """The `path` column of a reference: a path or URI as written; None for bytes or data URIs."""
    return path if isinstance(path, str) and not path.startswith("data:") else None


def _read_one(ref: Any, base: str | None, root: str | None, keep_bytes: bool | str) -> tuple:
    """One row of `read_images`' table (SCHEMA's order)."""
    try:
        found = _locate(ref, base, root)
    except Reject as reject:
        path = _text(ref.get("path") if isinstance(ref, Mapping) else ref)
        return None, None, None, path, None, reject.reason, reject.detail, None, None
    digest = hashlib.sha256(found.data).hexdigest()
    try:
        width, height = header_size(found.data)
    except Exception as exc:  # noqa: BLE001 - any Pillow failure: load_image would fail alike
        first = ("no image format Pillow reads" if isinstance(exc, UnidentifiedImageError)  # its
                 else (str(exc).strip().splitlines() or [type(exc).__name__])[0])  # text: a BytesIO
        detail = f"image {_name(ref)}: not an image Pillow can open ({first})"
        return None, None, None, found.path, digest, UNREADABLE, detail, found.location, len(found.data)
    keep = keep_bytes is True or (keep_bytes == INLINE and found.location is None)
    return width, height, found.data if keep else None, found.path, digest, None, None, found.location, len(found.data)


def read_images(refs: Sequence[Any], *, base: str | None, root: str | None, keep_bytes: bool | str,
                threads: int = 8) -> pa.Table:
    """One row per reference (SCHEMA): `width`, `height` as load_image sees the image (after its
    EXIF orientation), `bytes` (the file's, when `keep_bytes`), `path` (as written; null for bytes
    and data URIs), `sha256` (hex of the bytes, whenever they were read), `reason` (REMOTE, MISSING
    or UNREADABLE; null when fine), `detail` (one line naming the reference), `location` (the
    absolute path or URI it was read from; null for bytes and data URIs) and `size` (its bytes).
    `keep_bytes` INLINE keeps only the bytes that have no location (they cannot be read again).

    Relative paths are joined to `root` when given, else to `base` (the data file's folder), else
    to the current folder. Each image's file is read whole (its sha256 needs every byte) but only
    its header is parsed. `etl.images.workers` reads them in worker processes instead.
    """
    return rows_table(read_rows(refs, base, root, keep_bytes, threads))


def read_rows(refs: Sequence[Any], base: str | None, root: str | None, keep_bytes: bool | str,
              threads: int = 1) -> list[tuple]:
    """`read_images`' rows as tuples (SCHEMA's order), read on `threads` threads."""
    # Per-image Python is fine here: the work is I/O, as the tokenizer's per-text call is its own
    # work. Measured on the 10,001 images of bench/images.py (1.4 GB, 29 files in the page cache),
    # one thread: read 0.1 s, sha256 0.72 s (no GIL), Pillow's header 0.33 s (GIL), against ~2.3 ms
    # an image for load_image's decode. More threads overlap the waits of a cold disk or an object
    # store but not the header's GIL: 8 threads took 1.7 s against 1.4 s on one.
    def one(ref: Any) -> tuple:
        return _read_one(ref, base, root, keep_bytes)

    if threads > 1 and len(refs) > 1:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            return list(pool.map(one, refs))
    return [one(ref) for ref in refs]


def rows_table(rows: Sequence[tuple]) -> pa.Table:
    """The table (SCHEMA) of `read_rows`' rows."""
    columns = list(zip(*rows)) if rows else [()] * len(SCHEMA)
    return pa.table([_binary(col) if pa.types.is_binary(field.type) else pa.array(col, type=field.type)
                     for col, field in zip(columns, SCHEMA)], schema=SCHEMA)


def _binary(values: Sequence[bytes | None]) -> pa.Array:
    """A binary array from one join of the bytes: `pa.array` of 5,000 images (370 MB) took 1.6 s, as
    long as reading and hashing them; the join takes ~0.1 s."""
    lengths = np.fromiter((0 if v is None else len(v) for v in values), np.int64, len(values))
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    if offsets[-1] >= 2**31:  # more than binary's int32 offsets hold: pa.array makes it chunked
        return pa.array(values, pa.binary())
    valid = np.fromiter((v is not None for v in values), bool, len(values))
    data = pa.py_buffer(b"".join(v for v in values if v is not None))
    bitmap = None if valid.all() else pa.array(valid).buffers()[1]
    return pa.Array.from_buffers(pa.binary(), len(values), [bitmap, pa.py_buffer(offsets.astype(np.int32)), data],
                                 null_count=int((~valid).sum()))
