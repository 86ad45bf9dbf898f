"""Image files read again and checked against the sha256 a first read gave: what `--images embed`
writes, read when its `data` part is written, into one buffer sized from its first read, so the run
holds no image's bytes while it plans (`etl.pipeline.images`); and `--images reference` data as the
loader reads it (`etl.images.pixels.read_checked`)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from etl.errors import EtlError
from etl.images.read import Reject, read_file, read_uri
from etl.ingest.discover import is_uri


class Wording(NamedTuple):
    """What a failed check says: `changed` (with `{where}`) and, for a file gone, `missing` (with
    the reader's `{detail}`)."""

    changed: str
    missing: str


WHILE_RUN = Wording("image {where} changed while etl run read it (its bytes differ from the first read's); "
                    "rerun when the images are settled", "{detail}, though it was read earlier in this run")


def read_again(locations: Sequence[str], sha256: Sequence[str], sizes: Sequence[int], *,
               threads: int = 4) -> pa.Array:
    """The bytes at `locations` (read_images' `location`s, with the `size`s and sha256s they had): what
    `--images embed` writes, read when its part is written, straight into one buffer (no copy after
    the read). No header is parsed: reading and hashing release the GIL, so the threads share the
    cores.

    Raises:
        EtlError: a file that cannot be read now, or whose bytes changed since they were read.
    """
    offsets = np.concatenate(([0], np.cumsum(np.asarray(sizes, np.int64))))
    if offsets[-1] >= 2**31:  # more than a binary array's int32 offsets: one array per image
        return pa.array([checked_bytes(w, h) for w, h in zip(locations, sha256, strict=True)], pa.binary())
    buffer = np.empty(int(offsets[-1]), np.uint8)
    view = memoryview(buffer)

    def one(k: int) -> None:
        checked_bytes(locations[k], sha256[k], view[offsets[k]:offsets[k + 1]])

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(one, range(len(locations))))
    return pa.Array.from_buffers(pa.binary(), len(locations),
                                 [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(buffer)])


def checked_bytes(where: str, sha256: str, into: memoryview | None = None, *,
                  wording: Wording = WHILE_RUN) -> bytes | None:
    """The bytes at `where` (read into `into`, sized as they were, when given: then None), checked
    against `sha256`.

    Raises:
        EtlError: the file cannot be read, or its bytes are not the ones `sha256` names (`wording`).
    """
    changed = EtlError(wording.changed.format(where=where))
    try:
        if into is not None and not is_uri(where):
            with open(where, "rb") as file:
                if file.readinto(into) != len(into) or file.read(1):
                    raise changed
            data: bytes | memoryview = into
        else:
            data = read_uri(where, where) if is_uri(where) else read_file(where, where)
            if into is not None:
                if len(data) != len(into):
                    raise changed
                into[:] = data
    except Reject as reject:
        raise EtlError(wording.missing.format(detail=reject.detail)) from None
    except OSError as exc:
        raise EtlError(f"image {where}: cannot read it ({exc.strerror or exc})") from exc
    if hashlib.sha256(data).hexdigest() != sha256:
        raise changed
    return None if into is not None else bytes(data)
