"""Whole `etl run`s through the CLI with a tiny trained tokenizer: the token cache never changes a
byte of data/ or turns/ (no cache, cold, warm, damaged, other seq_len), its manifest entry says
where ids came from, its size cap holds, and the bytes tokenizer leaves it alone."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from etl.cache.segments import read_segment
from etl.cli import main
from tests.cache.common import (
    all_files,
    chats,
    etl_run,
    flip_middle,
    output_digests,
    segment_files,
    write_jsonl,
)

N_CHATS = 60
# Per chat: a system, a user and an assistant turn; the system prompt is the same in all, user
# turns take 7 values, assistant turns are all different (one chunk: one batch of contents).
STRINGS, DISTINCT = 3 * N_CHATS, 1 + 7 + N_CHATS


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("src") / "chats.jsonl", chats(N_CHATS)).parent


@pytest.fixture
def flags(tiny_tokenizer_path: Path) -> list[str]:
    return ["--tokenizer", str(tiny_tokenizer_path), "--template", "chatml"]


def without_cache_entry(manifest: dict) -> dict:
    return {k: v for k, v in manifest.items() if k not in ("token_cache", "record_sha256")}  # the checksum covers it


def test_output_is_the_same_with_or_without_the_cache(src: Path, flags: list[str], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """--no-cache, a cold cache, a warm cache and a cache with a damaged segment write
    byte-identical data/ and turns/ (sha256) and manifests that differ only in `token_cache`,
    whose counts say where the ids came from each time."""
    cache = tmp_path / "cache"
    plain = etl_run(src, tmp_path / "plain", *flags, "--no-cache")
    cold = etl_run(src, tmp_path / "cold", *flags, "--cache", str(cache))
    warm = etl_run(src, tmp_path / "warm", *flags, "--cache", str(cache))
    (seg,) = segment_files(cache)
    capsys.readouterr()
    flip_middle(seg)
    damaged = etl_run(src, tmp_path / "damaged", *flags, "--cache", str(cache))
    err = capsys.readouterr().err
    assert "warning" in err and "damaged" in err and seg.name in err

    digests = output_digests(tmp_path / "plain")
    for name in ("cold", "warm", "damaged"):
        assert output_digests(tmp_path / name) == digests, name
    for manifest in (cold, warm, damaged):
        assert without_cache_entry(manifest) == without_cache_entry(plain)

    assert plain["token_cache"]["dir"] is None
    assert (plain["token_cache"]["strings"], plain["token_cache"]["distinct"]) == (STRINGS, DISTINCT)
    assert plain["token_cache"]["tokenized"] == DISTINCT and plain["token_cache"]["from_cache"] == 0
    assert Path(cold["token_cache"]["dir"]) == cache
    assert (cold["token_cache"]["tokenized"], cold["token_cache"]["segments_written"]) == (DISTINCT, 1)
    assert warm["token_cache"]["tokenized"] == 0 and warm["token_cache"]["from_cache"] == DISTINCT
    assert warm["token_cache"]["hit_rate"] == 1.0 and warm["token_cache"]["segments_written"] == 0
    assert warm["token_cache"]["tokens_from_cache"] == cold["token_cache"]["tokens_tokenized"] > 0
    assert damaged["token_cache"]["segments_damaged"] == 1 and damaged["token_cache"]["segments_written"] == 1
    assert damaged["token_cache"]["tokenized"] == DISTINCT
    # The damaged bytes are gone: the texts were written anew, and as the same ids make the same
    # bytes, the new segment may take the old name; either way every segment is whole again.
    (new,) = segment_files(cache)
    assert new.stem == hashlib.sha256(new.read_bytes()).hexdigest()
    assert read_segment(new).num_rows == DISTINCT
    assert not (tmp_path / "default-cache").exists()  # --cache was used, not $ETL_CACHE_DIR


def test_warm_run_with_another_seq_len(src: Path, flags: list[str], tmp_path: Path) -> None:
    """A rerun with another --seq-len tokenizes nothing (hit rate 1.0) and writes exactly what a
    --no-cache run at that seq_len writes (which differs from the first run's output)."""
    cache = tmp_path / "cache"
    etl_run(src, tmp_path / "first", *flags, "--cache", str(cache))
    warm = etl_run(src, tmp_path / "warm", *flags, "--cache", str(cache), "--seq-len", "48")
    plain = etl_run(src, tmp_path / "plain", *flags, "--no-cache", "--seq-len", "48")
    assert warm["token_cache"]["tokenized"] == 0 and warm["token_cache"]["hit_rate"] == 1.0
    assert output_digests(tmp_path / "warm") == output_digests(tmp_path / "plain")
    assert output_digests(tmp_path / "warm") != output_digests(tmp_path / "first")
    assert warm["seq_len"] == plain["seq_len"] == 48


def test_default_cache_is_etl_cache_dir(src: Path, flags: list[str], isolated_cache: Path, tmp_path: Path) -> None:
    """Without --cache the run uses $ETL_CACHE_DIR (here a tmp folder) and marks it as a cache."""
    manifest = etl_run(src, tmp_path / "out", *flags)
    assert Path(manifest["token_cache"]["dir"]) == isolated_cache
    assert (isolated_cache / "ETL_TOKEN_CACHE").is_file() and len(segment_files(isolated_cache)) == 1


@pytest.mark.parametrize("how", ["flag", "env"])
def test_tiny_size_cap_evicts_after_the_run(src: Path, flags: list[str], tmp_path: Path, how: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A cap of 0.000001 GB (1,000 bytes; --cache-max-gb or $ETL_CACHE_MAX_GB): after the run the
    cache's segments hold at most that, and the output is still the --no-cache one."""
    cache = tmp_path / "cache"
    cap = ["--cache-max-gb", "0.000001"] if how == "flag" else []
    if how == "env":
        monkeypatch.setenv("ETL_CACHE_MAX_GB", "0.000001")
    manifest = etl_run(src, tmp_path / "capped", *flags, "--cache", str(cache), *cap)
    assert manifest["token_cache"]["segments_written"] == 1
    assert sum(p.stat().st_size for p in segment_files(cache)) <= 1000
    etl_run(src, tmp_path / "plain", *flags, "--no-cache")
    assert output_digests(tmp_path / "capped") == output_digests(tmp_path / "plain")
    again = etl_run(src, tmp_path / "again", *flags, "--cache", str(cache), *cap)
    assert again["token_cache"]["from_cache"] == 0  # it was evicted: tokenized again
    assert output_digests(tmp_path / "again") == output_digests(tmp_path / "plain")


def test_bytes_tokenizer_has_no_cache(src: Path, tmp_path: Path) -> None:
    """The built-in bytes tokenizer: no `token_cache` in the manifest, and nothing written to the
    cache folder (a missing one is not made, an empty one stays empty)."""
    missing, empty = tmp_path / "missing", tmp_path / "empty"
    empty.mkdir()
    for cache in (missing, empty):
        manifest = etl_run(src, tmp_path / f"out-{cache.name}", "--tokenizer", "bytes", "--template", "chatml",
                           "--cache", str(cache))
        assert "token_cache" not in manifest
        assert manifest["counts"]["written"] == N_CHATS
    assert not missing.exists()
    assert list(empty.iterdir()) == []


def test_cache_folder_that_is_not_a_cache(src: Path, flags: list[str], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """--cache DIR where DIR holds other files and no ETL_TOKEN_CACHE marker: the run fails (exit
    2) with an error naming DIR, and DIR is left exactly as it was; a file as DIR fails too."""
    mine = tmp_path / "my-documents"
    mine.mkdir()
    (mine / "thesis.txt").write_text("precious")
    (mine / "sub").mkdir()
    (mine / "sub" / "data.parquet").write_bytes(b"PAR1")
    before = all_files(mine)
    assert main(["run", str(src), str(tmp_path / "out"), "--quiet", *flags, "--cache", str(mine)]) == 2
    err = capsys.readouterr().err
    assert str(mine) in err and "not an etl token cache" in err
    assert all_files(mine) == before and sorted(p.name for p in mine.iterdir()) == ["sub", "thesis.txt"]

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert main(["run", str(src), str(tmp_path / "out2"), "--quiet", *flags, "--cache", str(a_file)]) == 2
    assert str(a_file) in capsys.readouterr().err
    assert a_file.read_text() == "x"


def test_cache_and_no_cache_together_is_an_error(src: Path, flags: list[str], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """--cache X --no-cache: exit 2, an error naming both flags, X not made, no output written."""
    cache = tmp_path / "cache"
    assert main(["run", str(src), str(tmp_path / "out"), "--quiet", *flags, "--cache", str(cache), "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert "--cache" in err and "--no-cache" in err
    assert not cache.exists()
    assert not (tmp_path / "out" / "_manifest.json").exists()


def test_negative_cap_is_an_error(src: Path, flags: list[str], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """--cache-max-gb -1 and ETL_CACHE_MAX_GB=lots are usage errors (exit 2) that say what is wrong,
    before the cache folder is made."""
    args = ["run", str(src), str(tmp_path / "out"), "--quiet", *flags, "--cache", str(tmp_path / "c")]
    assert main([*args, "--cache-max-gb", "-1"]) == 2
    assert ">= 0" in capsys.readouterr().err
    monkeypatch.setenv("ETL_CACHE_MAX_GB", "lots")
    assert main(args) == 2
    assert "ETL_CACHE_MAX_GB" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_many_chunks_tokenize_each_text_once(src: Path, flags: list[str], tmp_path: Path) -> None:
    """Cut in many small chunks (--chunk-mb 0.002), a cold run still tokenizes each distinct text of
    the whole input once (later chunks find the system prompt and repeated user turns among this
    run's ids), and writes what a --no-cache run with the same chunks writes."""
    small = ["--chunk-mb", "0.002"]
    cold = etl_run(src, tmp_path / "cold", *flags, *small, "--cache", str(tmp_path / "cache"))
    plain = etl_run(src, tmp_path / "plain", *flags, *small, "--no-cache")
    assert plain["token_cache"]["distinct"] > DISTINCT  # several batches: repeats across them
    assert cold["token_cache"]["tokenized"] == DISTINCT
    assert cold["token_cache"]["from_cache"] == cold["token_cache"]["distinct"] - DISTINCT > 0
    assert cold["token_cache"]["strings"] == STRINGS
    assert output_digests(tmp_path / "cold") == output_digests(tmp_path / "plain")


def test_mixture_reads_and_fills_the_cache(flags: list[str], tmp_path: Path) -> None:
    """A mixture of two sources (other keys, the same user questions): a cold run tokenizes the
    second source's repeated questions not at all (found among the first source's ids), a warm run
    nothing, and both write what --no-cache writes."""
    a = write_jsonl(tmp_path / "in" / "qa.jsonl", chats(N_CHATS))
    b = write_jsonl(tmp_path / "in" / "talk.jsonl", [
        {"turns": [{"speaker": "user", "text": chats(N_CHATS)[i]["messages"][1]["content"]},
                   {"speaker": "assistant", "text": f"answer {i}"}]} for i in range(30)])
    config = tmp_path / "mix.toml"
    config.write_text(f"""
seq_len = 256
[[sources]]
name = "qa"
path = "{a}"
[[sources]]
name = "talk"
path = "{b}"
input = {{ messages_key = "turns", role_key = "speaker", content_key = "text" }}
""", encoding="utf-8")

    def mix(dst: str, *extra: str) -> dict:
        assert main(["run", "--config", str(config), str(tmp_path / dst), "--quiet", *flags, *extra]) == 0
        return json.loads((tmp_path / dst / "_manifest.json").read_text(encoding="utf-8"))

    cache = str(tmp_path / "cache")
    plain, cold, warm = mix("plain", "--no-cache"), mix("cold", "--cache", cache), mix("warm", "--cache", cache)
    # Each batch's distinct texts, less talk's 7 questions: found among qa's ids of this run.
    assert cold["token_cache"]["distinct"] == plain["token_cache"]["distinct"] > DISTINCT + 30
    assert cold["token_cache"]["from_cache"] == 7
    assert cold["token_cache"]["tokenized"] == plain["token_cache"]["tokenized"] - 7
    assert warm["token_cache"]["tokenized"] == 0 and warm["token_cache"]["hit_rate"] == 1.0
    assert output_digests(tmp_path / "cold") == output_digests(tmp_path / "plain") == output_digests(tmp_path / "warm")
    assert plain["counts"] == warm["counts"]
