"""Decompressed byte streams of gzip / zstd inputs, and the check of a whole file before any
of it is used (`verify`): a damaged archive gives no records, not altered ones."""

from __future__ import annotations

import warnings
import zlib
from pathlib import Path
from typing import Any, BinaryIO

from etl.errors import EtlWarning
from etl.ingest.discover import Source, UnreadableFile
from etl.ingest.objects import open_stream

RAW_BLOCK = 1 << 16  # compressed bytes read from the file at a time
# Compressed bytes given to a decompressor at a time: what one call can expand to bounds memory
# while verifying (gzip at most ~1,000x: 4 MiB; zstd's run-length blocks ~32,000x: 128 MiB, where
# text gives ~100 KiB). 16 calls per raw block cost nothing measurable.
FEED_BYTES = 1 << 12
ZSTD_MAGIC = 0xFD2FB528
ZSTD_CHECKSUM_FLAG = 0x04  # bit 2 of a frame header's descriptor byte (RFC 8878 3.1.1.1.1)


class CorruptFile(UnreadableFile):
    """A compressed file that fails its integrity check (gzip CRC-32 or length, zstd checksum,
    a corrupt block) or ends inside a member or frame. Its records are not used at all: the
    check comes at the end of the stream, after records that could already be altered."""

    reason = "corrupt_file"


class _DecompressedStream:
    """A decompressed byte stream over raw blocks, with damage reported after the good data.

    `read(n)` returns every byte decompressed before damage (a truncated stream, a corrupt
    block); the error (`CorruptFile`) is raised by the next call. `etl run` reads a file so
    only after `verify` passed it; `keep=False` decompresses to nowhere (`verify`).
    """

    def __init__(self, fh: BinaryIO, compression: str, *, keep: bool = True) -> None:
        self._fh = fh
        self._compression = compression
        self._keep = keep
        self._pending = bytearray()
        self._error: Exception | None = None
        self._done = False
        self._dec = self._new_decompressor()
        self._member_started = False  # a member / frame has begun (gzip's zero padding is not one)
        self._head = b""  # zstd: the start of a frame, until its header's descriptor byte is in
        self.unchecked_frames = 0  # zstd frames written without a checksum
        self.closed = False

    def _new_decompressor(self) -> Any:  # a zlib or zstandard decompression object
        if self._compression == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        # zstandard: optional, only for .zst inputs
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj()

    def _feed(self, data: bytes) -> None:
        """Decompress `data` into the pending buffer, member after member (frame after frame)."""
        if self._compression == "gzip":
            while data:
                if not self._member_started:
                    stripped = data.lstrip(b"\x00")  # padding after the last member
                    if not stripped:
                        return
                    data, self._member_started = stripped, True
                self._out(self._dec.decompress(data))
                if not self._dec.eof:
                    return
                data = self._dec.unused_data
                self._dec, self._member_started = self._new_decompressor(), False
        else:
            while data:
                if not self._member_started:
                    if len(data := self._head + data) < 5:  # magic number and descriptor: wait
                        self._head = data
                        return
                    self._head, self._member_started = b"", True
                    is_zstd = int.from_bytes(data[:4], "little") == ZSTD_MAGIC  # not a skippable frame
                    self.unchecked_frames += is_zstd and not data[4] & ZSTD_CHECKSUM_FLAG
                self._out(self._dec.decompress(data))
                if not self._dec.eof:
                    return
                data = self._dec.unused_data
                self._dec, self._member_started = self._new_decompressor(), False  # a next frame

    def _out(self, data: bytes) -> None:
        if self._keep:
            self._pending += data

    def _fill(self, n: int) -> None:
        # zstandard: optional, only for .zst inputs
        import zstandard

        while len(self._pending) < n and not self._done and self._error is None:
            raw = self._fh.read(RAW_BLOCK)
            try:
                if not raw:
                    self._done = True
                    if self._compression == "gzip":
                        self._out(self._dec.flush())
                        truncated = self._member_started
                    else:
                        truncated = bool(self._head) or (self._member_started and not self._dec.eof)
                    if truncated:
                        self._error = CorruptFile(f"truncated {self._compression} stream")
                    return
                for start in range(0, len(raw), FEED_BYTES):
                    self._feed(raw[start : start + FEED_BYTES])
            except (zlib.error, zstandard.ZstdError) as exc:
                self._error = CorruptFile(f"corrupt {self._compression} stream ({exc})")

    def read(self, n: int = -1) -> bytes:
        self._fill(n if n >= 0 else 1 << 62)
        if not self._pending and self._error is not None:
            error, self._error = self._error, None
            self._done = True
            raise error
        if n < 0 or n >= len(self._pending):
            out = bytes(self._pending)
            self._pending.clear()
        else:
            out = bytes(self._pending[:n])
            del self._pending[:n]
        return out

    def close(self) -> None:
        self.closed = True
        self._fh.close()

    def __enter__(self) -> BinaryIO:
        return self  # type: ignore[return-value]

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open_raw(source: Source) -> BinaryIO:
    """The file's bytes as stored; SRC given as an s3://, gs://... URI: streamed through pyarrow."""
    if isinstance(source.path, Path):
        return open(source.path, "rb")

    return open_stream(source.path)  # type: ignore[return-value]


def open_binary(source: Source, raw: list[BinaryIO] | None = None) -> BinaryIO:
    """The decompressed byte stream; `raw` receives the file object under it (for tell())."""
    fh = _open_raw(source)
    if raw is not None:
        raw.append(fh)
    if source.compression in ("gzip", "zstd"):
        return _DecompressedStream(fh, source.compression)  # type: ignore[return-value]
    return fh


def verify(source: Source) -> None:
    """Check a compressed file whole before any of it is used, or raise `CorruptFile`.

    gzip checks each member's CRC-32 and length, zstd each frame's checksum, at the end of the
    member or frame: reading and checking as we go would already have written the records
    before a failed check, altered ("South Korea" became "South Kooea"). So the file is
    decompressed to nowhere first, in bounded memory (`FEED_BYTES`). Cost: a second
    decompression of every compressed input, a few percent more time for `etl run` (measured:
    docs/design.md, Measured costs). The first chunk waits for the check of the first file.

    A zstd frame written without a checksum (python-zstandard's default; the `zstd` tool writes
    one unless told not to) can only be checked for a broken structure: the file is read, with
    one warning naming it, since refusing it would refuse most such files, which are intact.
    """
    with _open_raw(source) as fh:
        stream = _DecompressedStream(fh, source.compression or "", keep=False)
        stream.read()
    if stream.unchecked_frames:
        warnings.warn(
            f"{source.name}: written without zstd checksums, so damage to it cannot be detected (it is read as "
            "it is); recompress it with the zstd tool, which writes them: zstd -dc FILE | zstd -o NEW.zst",
            EtlWarning, stacklevel=2,
        )
