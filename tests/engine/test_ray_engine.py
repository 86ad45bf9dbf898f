"""`etl run --engine ray` against the local engine: same files, rows and counts; a killed run
never looks finished and its rerun completes.

One local Ray cluster (2 CPUs, HOME and its temp dir in a temporary folder) serves the module; a
file lock keeps two xdist workers from running clusters at once.
"""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from etl.config.run_config import RunConfig
from etl.pipeline.run import run as run_local

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
    lock = open(tmp_path_factory.getbasetemp().parent / "etl-ray.lock", "w")  # noqa: SIM115
    fcntl.flock(lock, fcntl.LOCK_EX)  # the other xdist worker's cluster is gone first
    home = Path(tempfile.mkdtemp(prefix="etl-ray-"))  # short: Ray's socket paths have a length limit
    old_home = os.environ.get("HOME")
    os.environ["HOME"] = str(home)  # Ray 2.60 writes ~/.ray/auth_token
    try:
        info = ray.init(num_cpus=2, _temp_dir=str(home / "t"), include_dashboard=False,
                        configure_logging=False, log_to_driver=False)
        yield {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO), "RAY_ADDRESS": info.address_info["address"]}
    finally:
        ray.shutdown()
        os.environ["HOME"] = old_home if old_home is not None else ""
        shutil.rmtree(home, ignore_errors=True)
        lock.close()


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
