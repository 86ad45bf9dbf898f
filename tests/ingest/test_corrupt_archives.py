"""A compressed input that fails its integrity check puts nothing in data/.

gzip carries a CRC-32 and the length of each member, zstd (when written with one) a checksum of
each frame; both are checked only at the end of the stream, so every record before the check
could be altered. A plain .jsonl file has no check: its complete lines are kept.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import zstandard

from etl.cli import main
from etl.ingest import decompress
from etl.ingest.decompress import CorruptFile
from etl.ingest.discover import discover
from etl.ingest.reader import read_chunks
from etl.output.manifest import read_manifest

COUNTRIES = ["South Korea", "North Macedonia", "Peru", "New Zealand", "Cabo Verde", "Laos"]


def _body(n: int = 300, seed: int = 0) -> bytes:
    rng = random.Random(seed)
    rows = [{"messages": [{"role": "user", "content": f"Where is {rng.choice(COUNTRIES)}? ({i})"},
                          {"role": "assistant", "content": " ".join(rng.choice(COUNTRIES) for _ in range(6))}]}
            for i in range(n)]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


COMPRESS = {
    "gz": lambda body: gzip.compress(body, mtime=0),
    "zst": lambda body: zstandard.ZstdCompressor(write_checksum=True).compress(body),
}


def _rows(dst: Path) -> list[dict]:
    return pq.read_table(dst / "data", columns=["source_file", "source_line", "input_ids"]).to_pylist()


def _adds_up(counts: dict) -> bool:
    return counts["read"] == counts["written"] + sum(counts["dropped"].values()) + sum(counts["rejected"].values())


@pytest.mark.parametrize("ext", sorted(COMPRESS))
def test_fifty_bit_flips_never_write_altered_records(tmp_path: Path, monkeypatch, ext: str) -> None:
    # 512-byte raw reads: the damage is found many reads after the first records, as in a large file.
    monkeypatch.setattr(decompress, "RAW_BLOCK", 512)
    body = _body()
    whole = COMPRESS[ext](body)
    src = tmp_path / "raw"
    src.mkdir()
    (src / "clean.jsonl").write_bytes(body)
    rng = random.Random(26)
    for k in range(50):
        damaged = bytearray(whole)
        bit = rng.randrange(len(damaged) * 8)
        damaged[bit // 8] ^= 1 << (bit % 8)
        (src / f"f{k:02}.jsonl.{ext}").write_bytes(bytes(damaged))
    assert main(["run", str(src), str(tmp_path / "out"), "--quiet"]) == 3
    manifest = read_manifest(tmp_path / "out")
    rows = _rows(tmp_path / "out")
    source = {r["source_line"]: r["input_ids"] for r in rows if r["source_file"] == "clean.jsonl"}
    assert len(source) == 300
    altered = [(r["source_file"], r["source_line"]) for r in rows if r["input_ids"] != source[r["source_line"]]]
    assert altered == []
    counts = manifest["counts"]
    assert _adds_up(counts)
    lost = manifest["incomplete_inputs"]
    assert lost and {i["reason"] for i in lost} == {"corrupt_file"} and all(i["records_read"] == 0 for i in lost)
    assert counts["rejected"] == {"corrupt_file": len(lost)}
    kept = {r["source_file"] for r in rows} - {"clean.jsonl"}  # header bits that change no data (gzip's mtime)
    assert len(kept) + len(lost) == 50 and counts["written"] == 300 * (1 + len(kept))


@pytest.mark.parametrize("ext", sorted(COMPRESS))
def test_a_truncated_archive_gives_nothing_a_plain_file_its_complete_lines(
    tmp_path: Path, ext: str, capsys: pytest.CaptureFixture[str]
) -> None:
    body = _body(2000)
    whole = COMPRESS[ext](body)
    src = tmp_path / "raw"
    src.mkdir()
    (src / f"cut.jsonl.{ext}").write_bytes(whole[: len(whole) * 2 // 3])
    (src / "cut.jsonl").write_bytes(body[: len(body) * 2 // 3])  # ends inside a line
    assert main(["run", str(src), str(tmp_path / "out"), "--quiet"]) == 3
    manifest = read_manifest(tmp_path / "out")
    lines = body[: len(body) * 2 // 3].count(b"\n")
    assert {r["source_file"] for r in _rows(tmp_path / "out")} == {"cut.jsonl"}
    assert manifest["counts"]["written"] == lines
    assert manifest["counts"]["rejected"] == {"corrupt_file": 1, "invalid_json": 1}  # and the cut line
    assert [(i["path"], i["records_read"]) for i in manifest["incomplete_inputs"]] == [(f"cut.jsonl.{ext}", 0)]
    err = capsys.readouterr().err
    assert f"cut.jsonl.{ext}: failed its integrity check" in err and "exit status 3" in err


def test_zstd_without_checksums_is_read_with_one_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "raw"
    src.mkdir()
    (src / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(_body(20)))  # no checksum
    assert main(["run", str(src), str(tmp_path / "out"), "--quiet"]) == 0
    assert read_manifest(tmp_path / "out")["counts"]["written"] == 20
    warned = [line for line in capsys.readouterr().err.splitlines() if "checksum" in line]
    assert len(warned) == 1 and warned[0].startswith("etl run: warning: a.jsonl.zst: written without zstd checksums")
    assert "zstd -dc FILE | zstd -o NEW.zst" in warned[0]


@pytest.mark.parametrize("name", ["a.json.gz", "a.jsonl.gz", "a.json.zst"])
def test_every_kind_is_checked_before_its_first_chunk(tmp_path: Path, name: str) -> None:
    """.json goes through DuckDB, which reads the archive itself: the check comes first all the same."""
    rows = [json.loads(line) for line in _body(2000).splitlines()]
    body = (json.dumps(rows) if name.startswith("a.json.") else "".join(json.dumps(r) + "\n" for r in rows)).encode()
    whole = COMPRESS[name.rsplit(".", 1)[1]](body)
    damaged = bytearray(whole)
    damaged[-2] ^= 0x01  # gzip: the stored length; zstd: the checksum
    (tmp_path / name).write_bytes(bytes(damaged))
    with pytest.raises(CorruptFile):
        next(read_chunks(discover(str(tmp_path / name))[0], chunk_bytes=1 << 12))
