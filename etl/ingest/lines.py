"""JSON lines to `(source_line, line)` tables: each block of a file read once into a buffer its
lines' Arrow strings point at, split on newlines with numpy, checked as UTF-8 by Arrow
(`etl.ingest.reader.read_chunks` reads the other formats)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.columns import INVALID_UTF8
from etl.ingest.decompress import open_binary
from etl.ingest.discover import Source

Progress = Callable[[int], None]
RAW_SCHEMA = pa.schema([("source_line", pa.int64()), ("line", pa.large_string())])


def line_numbers(first: int, n: int) -> pa.Array:
    """int64 `first, first + 1, ...` (n of them). `from_buffers`, not `pa.array`: `pa.array`
    imports pandas where it is installed, before the first parse could start (docs/design.md,
    Start-up)."""
    numbers = np.arange(first, first + n, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(numbers)])


def _lines_from_block(block: bytes | memoryview, first_line: int) -> pa.Table:
    """Split a block of whole lines into a (source_line, line) table without copying text.

    Each string keeps its own trailing newline (JSON ignores trailing whitespace), so the
    strings are contiguous in the block and Arrow can point at it directly. Blank lines are
    not records: they are dropped, and the others keep their physical 0-based line numbers.
    """
    buf = np.frombuffer(block, dtype=np.uint8)
    ends = np.flatnonzero(buf == 10) + 1
    if len(buf) and buf[-1] != 10:
        ends = np.append(ends, len(buf))
    offsets = np.concatenate(([0], ends)).astype(np.int64)
    lines = pa.LargeStringArray.from_buffers(len(ends), pa.py_buffer(offsets.tobytes()), pa.py_buffer(block))
    table = pa.table([line_numbers(first_line, len(ends)), lines], schema=RAW_SCHEMA)
    lengths = np.diff(offsets)
    if (lengths <= 2).any():  # only then can a line be blank; skip the check otherwise
        nonblank = pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(lines)), 0)
        table = table.filter(nonblank)
    return table


def is_utf8(block: bytes | memoryview) -> bool:
    """Whether the block is valid UTF-8: Arrow's SIMD check, many times faster than `bytes.decode`
    (docs/design.md, Measured costs), which built a str of up to 4 bytes per character only to
    drop it."""
    offsets = np.array([0, len(block)], dtype=np.int64)
    text = pa.LargeStringArray.from_buffers(1, pa.py_buffer(offsets), pa.py_buffer(block))
    try:
        text.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _valid_utf8(block: bytes | memoryview) -> bytes | memoryview:
    """The block, with each line that is not valid UTF-8 replaced by a marker line.

    The whole block is checked in one pass; the per-line repair runs only for broken blocks.
    """
    if is_utf8(block):
        return block
    fixed = []
    for line in bytes(block).split(b"\n"):
        try:
            line.decode("utf-8")
            fixed.append(line)
        except UnicodeDecodeError:
            fixed.append((INVALID_UTF8 + repr(line[:200])).encode("utf-8"))
    return b"\n".join(fixed)


def _fill(fh: BinaryIO, rest: bytes, size: int) -> tuple[bytearray, int]:
    """One new buffer: `rest` (the last block's unfinished line), then up to `size` bytes of `fh`;
    returns it and its length.

    The file's bytes are copied once, into the buffer the chunk's strings then point at. Reading
    to a `bytes`, joining `rest` to it and slicing off the unfinished line copied each 16 MiB
    block twice more, into fresh pages (perf: a fifth of a T0 x10 run's page faults), with the GIL held.
    """
    buf = bytearray(len(rest) + size)
    buf[: len(rest)] = rest
    view, got = memoryview(buf), len(rest)
    readinto = getattr(fh, "readinto", None)  # not on a decompressed stream
    while got < len(buf):
        if readinto is not None:
            n = readinto(view[got:])
        else:
            data = fh.read(len(buf) - got)
            n = len(data)
            view[got : got + n] = data
        if not n:
            break
        got += n
    view.release()
    return buf, got


def jsonl_chunks(
    source: Source, chunk_bytes: int, progress: Progress | None = None, *, first_bytes: int | None = None
) -> Iterator[pa.Table]:
    next_line = 0
    rest = b""
    raw: list[BinaryIO] = []
    with open_binary(source, raw) as fh:
        size = first_bytes or chunk_bytes
        buf, end = _fill(fh, rest, size)
        start = 3 if buf.startswith(b"\xef\xbb\xbf") else 0  # a UTF-8 byte order mark is not data
        while True:
            if progress is not None and not raw[0].closed:
                progress(raw[0].tell())
            if end - start == len(rest):  # nothing more read
                if rest:
                    yield _lines_from_block(_valid_utf8(rest), next_line)
                return
            cut = buf.rfind(b"\n", start, end) + 1
            if cut == 0:  # one line longer than the block: keep reading
                rest = bytes(memoryview(buf)[start:end])
            else:
                rest = bytes(memoryview(buf)[cut:end])
                table = _lines_from_block(_valid_utf8(memoryview(buf)[start:cut]), next_line)
                next_line += buf.count(b"\n", start, cut)
                yield table
            buf, end = _fill(fh, rest, chunk_bytes)
            start = 0
