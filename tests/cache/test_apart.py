"""The token cache lies apart from SRC and DST: a cache inside SRC was read back as
input by the next run (20 records became 63, 43 of them bogus rejects, exit 0), and a cache equal
to DST was made before DST was checked. Each overlap is refused in one line naming the cache,
before a single file is written; a cache in a hidden folder of SRC, which etl never reads, is fine."""

from __future__ import annotations

from pathlib import Path

import pytest

from etl.cli import main
from tests.cache.common import chats, etl_run, write_jsonl


@pytest.fixture
def flags(tiny_tokenizer_path: Path) -> list[str]:
    return ["--tokenizer", str(tiny_tokenizer_path), "--template", "chatml", "--quiet"]


def tree(root: Path) -> list[str]:
    """Every path under root (files and folders), to show that nothing was made."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def refused(argv: list[str], tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Run `etl run` expecting the refusal: exit 2, one error line naming the cache and what to
    pass instead, and no file or folder made anywhere under tmp_path."""
    before = tree(tmp_path)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("etl run: error: "), err
    assert str(cache) in err and "--cache" in err and "ETL_CACHE_DIR" in err, err
    assert tree(tmp_path) == before
    return err


@pytest.mark.parametrize("where", ["inside SRC", "SRC", "SRC inside", "DST", "inside DST", "DST inside"])
def test_a_cache_overlapping_src_or_dst_is_refused_before_any_write(
        where: str, tmp_path: Path, flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    src = write_jsonl(tmp_path / "s" / "chats.jsonl", chats(20)).parent
    dst = tmp_path / "d"
    cache = {"inside SRC": src / "cache", "SRC": src, "SRC inside": tmp_path, "DST": dst,
             "inside DST": dst / "cache", "DST inside": dst.parent}[where]
    if where == "DST inside":  # DST lies in the cache (an etl cache: open_root alone would take it)
        src = write_jsonl(tmp_path / "elsewhere" / "s" / "chats.jsonl", chats(20)).parent
        cache, dst = tmp_path / "cache", tmp_path / "cache" / "d"
    err = refused(["run", str(src), str(dst), "--cache", str(cache), *flags], tmp_path, cache, capsys)
    assert ("DST" if "DST" in where else "SRC") in err


def test_the_second_run_reads_only_the_input(tmp_path: Path, flags: list[str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's steps: `etl run s d --cache s/cache` twice. The first run is refused, so no
    second run can read the cache as input; with the cache elsewhere both runs read 20."""
    src = write_jsonl(tmp_path / "s" / "chats.jsonl", chats(20)).parent
    refused(["run", str(src), str(tmp_path / "d"), "--cache", str(src / "cache"), *flags], tmp_path,
            src / "cache", capsys)
    for _ in range(2):
        manifest = etl_run(src, tmp_path / "d", *flags, "--cache", str(tmp_path / "cache"))
        assert manifest["counts"]["read"] == 20 and not manifest["counts"]["rejected"]


def test_etl_cache_dir_is_checked_and_without_it_no_cache_is_made(
        tmp_path: Path, flags: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_jsonl(tmp_path / "s" / "chats.jsonl", chats(5)).parent
    monkeypatch.setenv("ETL_CACHE_DIR", str(src / "tokens"))
    refused(["run", str(src), str(tmp_path / "d"), *flags], tmp_path, src / "tokens", capsys)
    monkeypatch.delenv("ETL_CACHE_DIR")
    # No cache by default: SRC may hold the folder earlier releases cached in, and none is made.
    monkeypatch.setenv("HOME", str(tmp_path))
    write_jsonl(tmp_path / ".cache" / "chats.jsonl", chats(5))
    manifest = etl_run(tmp_path / ".cache", tmp_path / "d", *flags)
    assert manifest["counts"]["read"] == 5 and manifest["token_cache"]["dir"] is None
    assert not (tmp_path / ".cache" / "etl").exists()


def test_file_and_glob_sources(tmp_path: Path, flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A file SRC is only that file: a cache beside it is fine, one holding it is refused. A
    glob's cache check is its base folder's (`s/*.jsonl`: s)."""
    src = write_jsonl(tmp_path / "s" / "chats.jsonl", chats(5))
    beside = etl_run(src, tmp_path / "d1", *flags, "--cache", str(src.parent / "cache"))
    assert beside["counts"]["read"] == 5
    holder = write_jsonl(tmp_path / "c" / "chats.jsonl", chats(5))
    refused(["run", str(holder), str(tmp_path / "d2"), "--cache", str(holder.parent), *flags], tmp_path,
            holder.parent, capsys)
    refused(["run", str(tmp_path / "s" / "*.jsonl"), str(tmp_path / "d3"), "--cache", str(tmp_path / "s" / "c2"),
             *flags], tmp_path, tmp_path / "s" / "c2", capsys)


def test_a_hidden_folder_inside_src_is_not_input(tmp_path: Path, flags: list[str]) -> None:
    """etl never reads hidden or underscore-prefixed folders of SRC (`etl.ingest.discover`): a
    cache there is fine, and the second run still reads 20 records (so `etl run ~ d --cache
    ~/.cache/etl/tokens` is not refused)."""
    src = write_jsonl(tmp_path / "s" / "chats.jsonl", chats(20)).parent
    for _ in range(2):
        manifest = etl_run(src, tmp_path / "d", *flags, "--cache", str(src / ".cache" / "tokens"))
        assert manifest["counts"]["read"] == 20 and not manifest["counts"]["rejected"]
    assert (src / ".cache" / "tokens" / "ETL_TOKEN_CACHE").is_file()


def test_each_source_of_a_mixture_is_checked(tmp_path: Path, tiny_tokenizer_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    a = write_jsonl(tmp_path / "a" / "chats.jsonl", chats(5)).parent
    b = write_jsonl(tmp_path / "b" / "chats.jsonl", chats(5)).parent
    config = tmp_path / "mix.toml"
    config.write_text(f'tokenizer = "{tiny_tokenizer_path}"\ntemplate = "chatml"\n'
                      f'[[sources]]\nname = "a"\npath = "{a}"\nweight = 0.5\n'
                      f'[[sources]]\nname = "b"\npath = "{b}"\nweight = 0.5\n')
    err = refused(["run", "--config", str(config), str(tmp_path / "d"), "--quiet", "--cache", str(b / "cache")],
                  tmp_path, b / "cache", capsys)
    assert str(b) in err


def test_the_bytes_tokenizer_leaves_the_cache_alone(tmp_path: Path) -> None:
    """A run with the bytes tokenizer neither reads nor fills the cache: where it lies is not checked."""
    src = write_jsonl(tmp_path / "s" / "chats.jsonl", chats(5)).parent
    manifest = etl_run(src, tmp_path / "d", "--tokenizer", "bytes", "--template", "chatml", "--cache", str(src / "c"))
    assert manifest["counts"]["read"] == 5 and not (src / "c").exists()
