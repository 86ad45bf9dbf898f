"""`etl run --engine ray` against the local engine: same files, rows and counts; a killed run
never looks finished and its rerun completes; an s3:// SRC (a local moto server) reads as a folder.

One local Ray cluster (2 CPUs, HOME and its temp dir in a temporary folder) serves the module; a
file lock keeps two xdist workers from running clusters at once.
"""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from etl.config.run_config import RunConfig
from etl.pipeline.run import run as run_local
from tests.engine.cluster import local_cluster
from tests.ingest.s3_server import S3, s3_server
from tests.ingest.test_uri import _raw

ray = pytest.importorskip("ray")
from etl.engine.ray_run import run as run_ray

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data"
T0 = SHARED / "t0-train-50k" / "t0_train_50k_per_template.jsonl.gz"
QWEN = SHARED / "qwen2.5-tokenizer"
pytestmark = pytest.mark.xdist_group("ray")


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A 2-CPU local cluster for the module; yields the environment a driver subprocess joins it with."""
    with local_cluster(tmp_path_factory, cpus=2) as env:
        yield env


def _chat(i: int) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": f"question {i % 37} " + "x" * (i % 13)},
                         {"role": "assistant", "content": f"answer {i}"}]}


def _fixture(root: Path) -> Path:
    """Three inputs: duplicates within and across files, bad lines, a truncated gzip."""
    src = root / "raw"
    src.mkdir()
    lines = [json.dumps(_chat(i)) for i in range(150)]
    lines[7], lines[40] = "{not json", json.dumps({"messages": "nope"})
    (src / "a.jsonl").write_text("\n".join(lines) + "\n")
    with gzip.open(src / "b.jsonl.gz", "wt") as f:
        f.write("\n".join(json.dumps(_chat(i)) for i in range(100, 260)) + "\n")
    whole = gzip.compress(("\n".join(json.dumps(_chat(i)) for i in range(300, 400)) + "\n").encode())
    (src / "c.jsonl.gz").write_bytes(whole[: len(whole) * 2 // 3])
    return src


def _files(dst: Path) -> dict[str, bytes]:
    return {p.relative_to(dst).as_posix(): p.read_bytes() for p in sorted(dst.rglob("*")) if p.is_file()}


def _rows(dst: Path, folder: str) -> list[dict[str, object]]:
    rows = [r for p in sorted((dst / folder).rglob("*.parquet")) for r in pq.read_table(p).to_pylist()]
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def _same(local: Path, ray_dst: Path) -> None:
    """Every row of data, turns and _rejects, the counts, then every byte."""
    for folder in ("data", "turns", "_rejects"):
        assert _rows(ray_dst, folder) == _rows(local, folder), folder
    manifest = json.loads((ray_dst / "_manifest.json").read_text())
    assert manifest["counts"] == json.loads((local / "_manifest.json").read_text())["counts"]
    assert _files(ray_dst) == _files(local)  # same chunks: the very same files


CONFIG = RunConfig(deduplicate=True, val_fraction=0.3, chunk_bytes=6144)  # 2-3 chunks a file


def test_ray_equals_local_on_a_fixture(ray_cluster: dict[str, str], tmp_path: Path) -> None:
    src = _fixture(tmp_path)
    local = run_local(str(src), str(tmp_path / "local"), CONFIG, progress=False)
    remote = run_ray(str(src), f"file://{tmp_path / 'ray'}", CONFIG, progress=False)
    counts = local["counts"]
    assert counts["dropped"]["duplicate"] >= 50 and counts["rejected"]["invalid_json"] == 1
    assert local["incomplete_inputs"] and remote["incomplete_inputs"] == local["incomplete_inputs"]
    assert {p["path"].split("/")[1] for p in remote["files"] if p["path"].startswith("data/")} == {"train", "val"}
    _same(tmp_path / "local", tmp_path / "ray")
    assert not (tmp_path / "ray" / "_staging").exists() and not (tmp_path / "ray" / "_journal.jsonl").exists()


def test_ray_equals_local_on_preference_pairs(ray_cluster: dict[str, str], tmp_path: Path) -> None:
    """Pairs (with a duplicated pair, a reject and a val split) come out of Ray as locally, byte for byte."""
    src = tmp_path / "pairs"
    src.mkdir()
    lines = (REPO / "tests" / "assets" / "preference" / "pairs.jsonl").read_text().splitlines()
    (src / "a.jsonl").write_text("\n".join(lines * 3) + "\n")
    config = RunConfig(input_type="preference", deduplicate=True, dedup_mode="exact", val_fraction=0.3,
                       chunk_bytes=4096)  # two chunks: a pair repeats within one and across them
    local = run_local(str(src), str(tmp_path / "local"), config, progress=False)
    run_ray(str(src), f"file://{tmp_path / 'ray'}", config, progress=False)
    assert local["kind"] == "preference" and local["counts"]["dropped"]["duplicate"] == 10
    _same(tmp_path / "local", tmp_path / "ray")


def test_ray_equals_local_on_image_conversations(ray_cluster: dict[str, str], tmp_path: Path) -> None:
    """Images read by the workers (relative to their data file), a bad one rejected, a repeated
    record deduplicated across chunks: the same files as the local engine's."""
    from tests.images.vl_folder import image_bytes, make_vl_folder

    folder = make_vl_folder(tmp_path / "vl")
    src = tmp_path / "src"
    (src / "img").mkdir(parents=True)
    for k, size in enumerate(((60, 40), (30, 90), (200, 120))):
        (src / "img" / f"{k}.png").write_bytes(image_bytes(size))
    chats = [{"messages": [{"role": "user", "content": f"<image>Who is {i % 9}?"},
                           {"role": "assistant", "content": "A cat."}], "images": [f"img/{i % 4}.png"]}
             for i in range(40)]  # img/3.png is missing
    (src / "a.jsonl").write_text("".join(json.dumps(chat) + "\n" for chat in chats))
    config = RunConfig(tokenizer=str(folder), tokenizer_backend="hf", deduplicate=True, chunk_bytes=2048)
    local = run_local(str(src), str(tmp_path / "local"), config, progress=False)
    run_ray(str(src), f"file://{tmp_path / 'ray'}", config, progress=False)
    assert local["counts"]["rejected"] == {"missing_image": 10} and local["counts"]["dropped"]["duplicate"] > 0
    _same(tmp_path / "local", tmp_path / "ray")


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_killed_ray_run_leaves_no_manifest_and_reruns(ray_cluster: dict[str, str], tmp_path: Path) -> None:
    src = _fixture(tmp_path)
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"split": {"val_fraction": 0.3}}))  # dedup: the test above
    dst = tmp_path / "ray"
    cmd = [sys.executable, "-m", "etl", "run", str(src), str(dst), "--engine", "ray", "--quiet",
           "--config", str(config), "--chunk-mb", str(2048 / (1 << 20))]
    proc = subprocess.Popen(cmd, env=ray_cluster, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    _wait_for(dst / "_staging" / "000000-000001", proc)  # the workers are writing parts now
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (dst / "_manifest.json").exists() and (dst / "_journal.jsonl").exists()
    config = RunConfig(val_fraction=0.3, chunk_bytes=2048)
    run_ray(str(src), str(dst), config, progress=False)  # removes what the killed run left
    run_local(str(src), str(tmp_path / "local"), config, progress=False)
    _same(tmp_path / "local", dst)


def test_a_quiet_ray_run_prints_nothing(ray_cluster: dict[str, str], tmp_path: Path) -> None:
    """Ray's own lines (the driver's `core_worker.cc` errors, Ray Data's UserWarnings) held too."""
    (tmp_path / "raw.jsonl").write_text("".join(json.dumps(_chat(i)) + "\n" for i in range(20)))
    cmd = [sys.executable, "-m", "etl", "run", str(tmp_path / "raw.jsonl"), str(tmp_path / "d"), "--engine", "ray",
           "--quiet"]
    done = subprocess.run(cmd, env=ray_cluster, capture_output=True, text=True, timeout=300, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


@pytest.mark.shared
@pytest.mark.skipif(not T0.exists() or not QWEN.exists(), reason="../shared data absent")
def test_ray_equals_local_on_t0(ray_cluster: dict[str, str], tmp_path: Path) -> None:
    """Real shared data with dedup and a val split on: Qwen2.5, ChatML, T0's first 3,000 records."""
    config = RunConfig(tokenizer=str(QWEN), template="chatml", input_type="prompt_completion", deduplicate=True,
                       val_fraction=0.1, max_items=3000, chunk_bytes=256 << 10)
    local = run_local(str(T0), str(tmp_path / "local"), config, progress=False)
    assert local["counts"]["dropped"]["duplicate"] > 0 and local["counts"]["written"] > 1000
    run_ray(str(T0), str(tmp_path / "ray"), config, progress=False)
    _same(tmp_path / "local", tmp_path / "ray")


def test_workers_get_an_absolute_tokenizer_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `ray start` cluster's workers run in the cluster's folder, not the driver's: a relative
    tokenizer path reached them as 'does not exist' (found with `--tokenizer ../shared/...`)."""
    from etl.engine.ray_run import for_workers

    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert for_workers(RunConfig(tokenizer="tok")).tokenizer == str(tmp_path / "tok")
    assert for_workers(RunConfig()).tokenizer == "bytes"
    # the tokenizer backend as a local run settles it: auto on a small input is tokenizers
    assert for_workers(RunConfig(), 1000).tokenizer_backend == "hf"
    assert for_workers(RunConfig(), 1 << 30).tokenizer_backend == "auto"
    assert for_workers(RunConfig(tokenizer_backend="gigatoken"), 1000).tokenizer_backend == "gigatoken"
    assert for_workers(RunConfig(tokenizer="missing")).tokenizer == "missing"  # the driver reports it


def test_a_worker_error_is_one_line_with_what_to_check() -> None:
    from etl.engine.ray_run import worker_error

    died = ("The actor died because of an error raised in its creation task\n  File \"x.py\", line 24\n"
            "etl.errors.EtlError: tokenizer tok does not exist; pass `bytes`, a tokenizer.json or a model directory")
    message = str(worker_error(RuntimeError(died)))
    assert message.startswith("--engine ray: a worker failed: tokenizer tok does not exist;")
    assert "\n" not in message and "same absolute paths" in message
    assert str(worker_error(RuntimeError("boom\nlast line"))).startswith("--engine ray: a worker failed: last line;")


@pytest.fixture()
def s3(tmp_path: Path) -> Iterator[S3]:
    with s3_server(tmp_path / "aws") as server:
        yield server


def test_ray_reads_s3_as_the_local_engine_reads_a_folder(ray_cluster: dict[str, str], s3: S3, tmp_path: Path) -> None:
    """An s3:// SRC (a local moto server): the driver lists the bucket, the workers open its files
    themselves from the URI each `Source` carries (with the cluster's credentials, set above)."""
    config = RunConfig(chunk_bytes=4096, val_fraction=0.3, deduplicate=True)
    src = _raw(tmp_path)
    s3.upload(src, "ray/raw")
    local = run_local(str(src), str(tmp_path / "local"), config, progress=False)
    remote = run_ray(s3.uri("ray/raw"), (tmp_path / "ray").as_uri(), config, progress=False)
    assert remote["counts"] == local["counts"] and remote["inputs"] == local["inputs"]
    _same(tmp_path / "local", tmp_path / "ray")
