"""SRC and DST as URIs (etl.ingest.location, etl.ingest.objects): `file://` runs equal plain-path
runs byte for byte; an `s3://` SRC on a local S3 server (moto) gives the rows a local folder does;
object-store DSTs and unreachable SRCs are one error line that says what to check.
"""

from __future__ import annotations

import gzip
import json
import pickle
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.cli import main
from etl.config.run_config import RunConfig
from etl.errors import EtlError
from etl.ingest.objects import discover_objects
from etl.pipeline.run import run

from .s3_server import S3, s3_server

CONFIG = RunConfig(chunk_bytes=4096, val_fraction=0.3)  # several chunks a file, both splits


def _chat(i: int) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": f"question {i} " + "y" * (i % 11)},
                         {"role": "assistant", "content": f"answer {i}"}]}


def _raw(root: Path) -> Path:
    """JSONL.gz (a bad line), Parquet in a subfolder, a JSON array, and files that are not input."""
    src = root / "raw"
    (src / "sub" / "_old").mkdir(parents=True)
    lines = [json.dumps(_chat(i)) for i in range(80)]
    lines[5] = "{not json"
    (src / "a.jsonl.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    pq.write_table(pa.table({"messages": [_chat(i)["messages"] for i in range(80, 140)]}),
                   src / "sub" / "b.parquet", row_group_size=16)
    (src / "c.json").write_text(json.dumps([_chat(i) for i in range(140, 170)], indent=1))
    (src / "sub" / "_old" / "x.jsonl").write_text(json.dumps(_chat(0)) + "\n")  # skipped
    (src / ".hidden.jsonl").write_text(json.dumps(_chat(0)) + "\n")  # skipped
    (src / "notes.txt").write_text("not input\n")
    return src


def _files(dst: Path) -> dict[str, bytes]:
    return {p.relative_to(dst).as_posix(): p.read_bytes() for p in sorted(dst.rglob("*")) if p.is_file()}


def _rows(dst: Path) -> list[dict[str, object]]:
    keep = ["id", "input_ids", "loss_mask", "source_file", "source_line"]
    return [r for p in sorted((dst / "data").rglob("*.parquet")) for r in pq.read_table(p, columns=keep).to_pylist()]


def test_file_uris_equal_plain_paths_byte_for_byte(tmp_path: Path) -> None:
    src = _raw(tmp_path)
    plain = run(str(src), str(tmp_path / "plain"), CONFIG, progress=False)
    run(src.as_uri(), (tmp_path / "uri").as_uri(), CONFIG, progress=False)
    assert plain["inputs"] == ["a.jsonl.gz", "c.json", "sub/b.parquet"]
    assert _files(tmp_path / "uri") == _files(tmp_path / "plain")
    run((src / "c.json").as_uri(), str(tmp_path / "one"), CONFIG, progress=False)  # a file URI


def test_cli_takes_file_uris_and_refuses_an_object_store_dst(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _raw(tmp_path)
    assert main(["run", str(src), str(tmp_path / "plain"), "--quiet", "--chunk-mb", "0.004"]) == 0
    assert main(["run", src.as_uri(), (tmp_path / "uri").as_uri(), "--quiet", "--chunk-mb", "0.004"]) == 0
    assert _files(tmp_path / "uri") == _files(tmp_path / "plain")
    capsys.readouterr()
    for dst in ("s3://bucket/out", "gs://bucket/out"):  # refused before any request is made
        assert main(["run", src.as_uri(), dst, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and dst in err and "upload" in err and "lock" in err
    assert not (tmp_path / "s3:").exists()


def test_unknown_scheme_and_bad_file_uri_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(EtlError, match="SRC nosuch://x: cannot resolve it"):
        run("nosuch://x", str(tmp_path / "out"), CONFIG, progress=False)
    with pytest.raises(EtlError, match="three slashes"):
        run("file://host/x", str(tmp_path / "out"), CONFIG, progress=False)
    with pytest.raises(EtlError, match=r"SRC foo://\*\*\*@x"):  # a user:secret@ part is never shown
        run("foo://user:secret@x", str(tmp_path / "out"), CONFIG, progress=False)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    with s3_server(tmp_path_factory.mktemp("aws")) as server:
        yield server


def test_s3_src_gives_the_rows_of_a_local_folder(s3: S3, tmp_path: Path) -> None:
    src = _raw(tmp_path)
    whole = gzip.compress("".join(json.dumps(_chat(i)) + "\n" for i in range(200, 300)).encode())
    (src / "d.jsonl.gz").write_bytes(whole[: len(whole) * 2 // 3])  # truncated: one reject, nothing of it used
    s3.upload(src, "data/raw")
    local = run(str(src), str(tmp_path / "local"), CONFIG, progress=False)
    remote = run(s3.uri("data/raw"), str(tmp_path / "s3"), CONFIG, progress=False)
    assert remote["inputs"] == local["inputs"] == ["a.jsonl.gz", "c.json", "d.jsonl.gz", "sub/b.parquet"]
    assert remote["counts"] == local["counts"]
    assert local["counts"]["rejected"] == {"invalid_json": 1, "corrupt_file": 1}
    assert remote["incomplete_inputs"] == local["incomplete_inputs"]
    assert _rows(tmp_path / "s3") == _rows(tmp_path / "local")
    assert _files(tmp_path / "s3") == _files(tmp_path / "local")  # the same chunks: the same files
    one = run(s3.uri("data/raw/sub/b.parquet"), str(tmp_path / "one"), CONFIG, progress=False)
    assert one["inputs"] == ["b.parquet"] and one["counts"]["written"] == 60


def test_s3_sources_pickle_with_the_uri_not_a_client(s3: S3, tmp_path: Path) -> None:
    s3.upload(_raw(tmp_path), "pickled")
    sources = discover_objects(s3.uri("pickled/"))
    assert [s.name for s in sources] == ["a.jsonl.gz", "c.json", "sub/b.parquet"]
    back = pickle.loads(pickle.dumps(sources))  # what a Ray worker gets
    assert back == sources and back[0].path.root == s3.uri("pickled/")
    assert str(back[0].path) == f"s3://{s3.bucket}/pickled/a.jsonl.gz"  # no options, no secrets


def test_cli_reads_s3(s3: S3, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _raw(tmp_path)
    s3.upload(src, "cli")
    assert main(["run", str(src), str(tmp_path / "local"), "--quiet"]) == 0
    assert main(["run", s3.uri("cli"), (tmp_path / "s3").as_uri(), "--quiet"]) == 0
    assert _files(tmp_path / "s3") == _files(tmp_path / "local")


def test_missing_s3_key_or_bucket_is_one_line(s3: S3, tmp_path: Path) -> None:
    s3.upload(_raw(tmp_path), "present")
    for uri in (s3.uri("absent"), s3.uri("x").replace(s3.bucket, "no-such-bucket")):
        with pytest.raises(EtlError) as caught:
            run(uri, str(tmp_path / "out"), CONFIG, progress=False)
        message = str(caught.value)
        assert "\n" not in message and uri in message and "AWS_ACCESS_KEY_ID" in message
    assert not (tmp_path / "out").exists()


def test_refused_credentials_are_one_line(s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import moto.settings

    s3.upload(_raw(tmp_path), "private")
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # moto checks keys from now
    with pytest.raises(EtlError, match="cannot list it .*AWS_SECRET_ACCESS_KEY") as caught:
        run(s3.uri("private"), str(tmp_path / "out"), CONFIG, progress=False)
    assert "\n" not in str(caught.value)
