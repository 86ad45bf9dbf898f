"""Decompressed byte streams of gzip / zstd inputs, damage reported after the good data."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any, BinaryIO

from etl.ingest.discover import Source, UnreadableFile

RAW_BLOCK = 1 << 16  # compressed bytes fed to a decompressor at a time


class DecompressedStream:
    """A decompressed byte stream over raw blocks, with damage reported after the good data.

    `read(n)` returns every byte decompressed before damage (a truncated stream, a corrupt
    block); the error is raised by the next call. So complete records before the damage are
    yielded however the caller sizes its reads, and then the file is `UnreadableFile`.
    """

    def __init__(self, fh: BinaryIO, compression: str) -> None:
        self._fh = fh
        self._compression = compression
        self._pending = bytearray()
        self._error: Exception | None = None
        self._done = False
        self._dec = self._new_decompressor()
        self._member_started = False  # gzip: a member has begun (trailing zero padding is not one)
        self.closed = False

    def _new_decompressor(self) -> Any:  # a zlib or zstandard decompression object
        if self._compression == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj()

    def _feed(self, data: bytes) -> None:
        """Decompress `data` into the pending buffer (gzip: member after member)."""
        if self._compression == "gzip":
            while data:
                if not self._member_started:
                    stripped = data.lstrip(b"\x00")  # padding after the last member
                    if not stripped:
                        return
                    data, self._member_started = stripped, True
                self._pending += self._dec.decompress(data)
                if not self._dec.eof:
                    return
                data = self._dec.unused_data
                self._dec, self._member_started = self._new_decompressor(), False
        else:
            while data:
                self._member_started = True
                self._pending += self._dec.decompress(data)
                if not self._dec.eof:
                    return
                data = self._dec.unused_data
                self._dec, self._member_started = self._new_decompressor(), False  # a next frame

    def _fill(self, n: int) -> None:
        import zstandard

        while len(self._pending) < n and not self._done and self._error is None:
            raw = self._fh.read(RAW_BLOCK)
            try:
                if not raw:
                    self._done = True
                    if self._compression == "gzip":
                        self._pending += self._dec.flush()
                        truncated = self._member_started
                    else:
                        truncated = self._member_started and not self._dec.eof
                    if truncated:
                        self._error = EOFError(f"truncated {self._compression} stream")
                    return
                self._feed(raw)
            except (zlib.error, zstandard.ZstdError) as exc:
                self._error = UnreadableFile(f"corrupt {self._compression} stream ({exc})")

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


def open_binary(source: Source, raw: list[BinaryIO] | None = None) -> BinaryIO:
    """The decompressed byte stream; `raw` receives the file object under it (for tell())."""
    if isinstance(source.path, Path):
        fh = open(source.path, "rb")  # noqa: SIM115 (closed by the stream that wraps it)
    else:  # SRC given as an s3://, gs://... URI: streamed through pyarrow
        from etl.ingest.objects import open_stream

        fh = open_stream(source.path)  # type: ignore[assignment]
    if raw is not None:
        raw.append(fh)
    if source.compression in ("gzip", "zstd"):
        return DecompressedStream(fh, source.compression)  # type: ignore[return-value]
    return fh
