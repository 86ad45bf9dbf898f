"""Parsed chunks in the token cache (`etl.cache.parsed`): a chunk read back equals `run_builder`'s
table; the key changes with any byte of the chunk and with the parse settings, and not with what
acts after the parse; a damaged file is removed and the chunk parsed again; the unread-field
warnings of a parse are given again on a warm run; the manifest counts the chunks."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from etl.cache import folder as fo
from etl.cache.parsed import ParsedChunks, chunk_key
from etl.config.run_config import RunConfig
from etl.formats.builders import BuilderQuery, connect, run_builder
from etl.ingest.discover import discover
from etl.ingest.reader import read_chunks
from etl.pipeline.startup import builder_query_for
from etl.tokens.templates import preset
from tests.cache.common import chats, etl_run, flip_middle, output_digests, write_jsonl


def raw_chunks(path: Path, chunk_bytes: int = 1 << 24) -> list[pa.Table]:
    return list(read_chunks(discover(str(path))[0], chunk_bytes=chunk_bytes))


def query_for(template: str = "chatml", **config: object) -> BuilderQuery:
    cfg = RunConfig().replace(template=template, **config)
    return builder_query_for(cfg, preset(template))


@pytest.fixture
def chunk(tmp_path: Path) -> pa.Table:
    (raw,) = raw_chunks(write_jsonl(tmp_path / "in.jsonl", chats(30)))
    return raw


def test_key_follows_the_bytes_and_the_parse_settings(chunk: pa.Table, tmp_path: Path) -> None:
    """Same chunk read twice: same key. One changed character, another line number, a slice, other
    roles (another template) or another record size limit: another key. seq_len does not parse."""
    query = query_for()
    (again,) = raw_chunks(write_jsonl(tmp_path / "again.jsonl", chats(30)))
    assert chunk_key(chunk, query) == chunk_key(again, query)
    changed = chats(30)
    changed[12]["messages"][2]["content"] += "!"
    (other,) = raw_chunks(write_jsonl(tmp_path / "changed.jsonl", changed))
    keys = {chunk_key(other, query), chunk_key(chunk.slice(0, 29), query),
            chunk_key(chunk.set_column(0, "source_line", pa.array(range(1, 31), pa.int64())), query),
            chunk_key(chunk, query_for("phi3")), chunk_key(chunk, query_for(max_record_bytes=1 << 20))}
    assert chunk_key(chunk, query) not in keys and len(keys) == 5
    assert chunk_key(chunk, query_for(seq_len=64)) == chunk_key(chunk, query)


def test_read_back_equals_the_parse(chunk: pa.Table, tmp_path: Path) -> None:
    """Cold: parsed and written; warm (a new run's listing): read back, equal to run_builder's
    table, schema and all, bad rows included."""
    records = [*(r for r in chats(5)), {"messages": "not a list"}, {"nothing": 1}]
    (raw,) = raw_chunks(write_jsonl(tmp_path / "mixed.jsonl", records))
    query, con = query_for(), connect()
    expected = run_builder(con, raw, query)
    cold = ParsedChunks(fo.open_root(tmp_path / "cache"))
    assert cold.parse(con, raw, query).equals(expected) and cold.summary() == {"from_cache": 0, "parsed": 1, "damaged": 0}
    warm = ParsedChunks(fo.open_root(tmp_path / "cache"))
    got = warm.parse(con, raw, query)
    assert got.equals(expected) and got.schema == expected.schema and expected["reason"].null_count < len(records)
    assert warm.summary() == {"from_cache": 1, "parsed": 0, "damaged": 0}
    (path,) = fo.parsed_files(tmp_path / "cache")
    assert path.name.startswith(chunk_key(raw, query) + ".")


def test_damaged_file_is_removed_and_parsed_again(chunk: pa.Table, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    query, con = query_for(), connect()
    ParsedChunks(fo.open_root(tmp_path / "cache")).parse(con, chunk, query)
    (path,) = fo.parsed_files(tmp_path / "cache")
    flip_middle(path)
    again = ParsedChunks(fo.open_root(tmp_path / "cache"))
    assert again.parse(con, chunk, query).equals(run_builder(con, chunk, query))
    assert again.summary() == {"from_cache": 0, "parsed": 1, "damaged": 1}
    assert "damaged" in capsys.readouterr().err
    (rewritten,) = fo.parsed_files(tmp_path / "cache")  # whole again, under its new bytes' name
    assert ParsedChunks(fo.open_root(tmp_path / "cache")).parse(con, chunk, query).equals(run_builder(con, chunk, query))
    assert rewritten.name.split(".")[0] == path.name.split(".")[0]


def test_warm_run_warns_about_unread_fields_again(tmp_path: Path, tiny_tokenizer_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A message field no builder reads: the warm run, which parses nothing, warns as the cold did."""
    records = chats(8)
    for r in records:
        r["messages"][1]["mood"] = "curious"
    src = write_jsonl(tmp_path / "src" / "in.jsonl", records).parent
    flags = ["--tokenizer", str(tiny_tokenizer_path), "--template", "chatml", "--cache", str(tmp_path / "cache")]
    said = []
    for name in ("cold", "warm"):
        capsys.readouterr()
        manifest = etl_run(src, tmp_path / name, *flags)
        said.append([line for line in capsys.readouterr().err.splitlines() if '"mood" is not read' in line])
    assert len(said[0]) == 1 and said[0] == said[1]
    assert manifest["token_cache"]["parsed_chunks"] == {"from_cache": 1, "parsed": 0, "damaged": 0}


def test_runs_over_many_chunks(tmp_path: Path, tiny_tokenizer_path: Path) -> None:
    """Many small chunks: a warm run reads every one back and writes what --no-cache writes; a file
    added to SRC is the only one parsed by the next run."""
    src = tmp_path / "src"
    write_jsonl(src / "a.jsonl", chats(300))
    flags = ["--tokenizer", str(tiny_tokenizer_path), "--template", "chatml", "--chunk-mb", "0.01"]
    cache = ["--cache", str(tmp_path / "cache")]
    cold = etl_run(src, tmp_path / "cold", *flags, *cache)["token_cache"]["parsed_chunks"]
    assert cold["parsed"] > 5 and cold["from_cache"] == 0
    warm = etl_run(src, tmp_path / "warm", *flags, *cache, "--seq-len", "48")["token_cache"]["parsed_chunks"]
    assert warm == {"from_cache": cold["parsed"], "parsed": 0, "damaged": 0}
    etl_run(src, tmp_path / "plain", *flags, "--no-cache", "--seq-len", "48")
    assert output_digests(tmp_path / "warm") == output_digests(tmp_path / "plain")
    write_jsonl(src / "b.jsonl", chats(3))
    more = etl_run(src, tmp_path / "more", *flags, *cache)["token_cache"]["parsed_chunks"]
    assert more == {"from_cache": cold["parsed"], "parsed": 1, "damaged": 0}


def test_bytes_tokenizer_and_no_cache_keep_no_parsed_chunks(tmp_path: Path, tiny_tokenizer_path: Path,
                                                             isolated_cache: Path) -> None:
    """The bytes tokenizer leaves the cache alone, parsed chunks too; --no-cache touches no folder."""
    src = write_jsonl(tmp_path / "src" / "in.jsonl", chats(5)).parent
    manifest = etl_run(src, tmp_path / "bytes", "--tokenizer", "bytes", "--template", "chatml",
                       "--cache", str(tmp_path / "c1"))
    assert "token_cache" not in manifest and not fo.parsed_files(tmp_path / "c1")
    manifest = etl_run(src, tmp_path / "none", "--tokenizer", str(tiny_tokenizer_path), "--template", "chatml",
                       "--no-cache")
    assert "parsed_chunks" not in manifest["token_cache"] and not isolated_cache.exists()


def test_timings_line_says_what_the_cache_served(tmp_path: Path, tiny_tokenizer_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`--timings` on a warm run: every distinct text and the one input chunk came from the cache."""
    src = write_jsonl(tmp_path / "src" / "in.jsonl", chats(10)).parent
    flags = ["--tokenizer", str(tiny_tokenizer_path), "--template", "chatml", "--cache", str(tmp_path / "cache")]
    etl_run(src, tmp_path / "cold", *flags)
    capsys.readouterr()
    etl_run(src, tmp_path / "warm", *flags, "--timings")
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("etl run: token cache")]
    assert "30 texts, 18 distinct per batch, 18 read from the cache (100.0%), 0 tokenized" in line
    assert line.endswith("; 1 of 1 input chunks read back parsed")
