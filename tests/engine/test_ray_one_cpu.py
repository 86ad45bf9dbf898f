"""`--engine ray` on a cluster of one CPU (`ray start --num-cpus 1`): it hung before, since Ray Data's
re-cut to one chunk per block and the dedup's shuffles asked for a whole CPU each, which the
actor's 0.5 and a read task's 0.5 never left free. Now it writes what the local engine writes,
byte for byte, dedup included. The cluster is `ray start`'s, in its own processes: a second
`ray.init` in a test process that already ran one was refused its GCS under load."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from etl.pipeline.run import run as run_local
from tests.engine.cluster import cluster_home

pytest.importorskip("ray")
from tests.engine.test_ray_engine import CONFIG, REPO, _fixture, _same

pytestmark = pytest.mark.xdist_group("ray")
RAY = str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def one_cpu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """(address, environment) of a 1-CPU head node started with `ray start`, stopped after."""
    with cluster_home(tmp_path_factory) as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env |= {"HOME": str(home), "PYTHONPATH": str(REPO)}  # the cluster's ~/.ray/auth_token is the driver's
        port = _free_port()
        try:
            subprocess.run([RAY, "start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
                            f"--temp-dir={home / 't'}"], env=env, check=True, capture_output=True)
            yield f"127.0.0.1:{port}", env
        finally:
            subprocess.run([RAY, "stop", "--force"], env=env, check=False, capture_output=True)


# The driver, in a process of its own that joins the cluster at RAY_ADDRESS.
DRIVER = """import sys
from etl.engine.ray_run import run
from tests.engine.test_ray_engine import CONFIG
run(sys.argv[1], "file://" + sys.argv[2], CONFIG, progress=False)
"""


@pytest.mark.timeout(180)  # a hang shows as this test's timeout
def test_a_one_cpu_cluster_runs_and_equals_local(one_cpu: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    address, env = one_cpu
    src = _fixture(tmp_path)
    local = run_local(str(src), str(tmp_path / "local"), CONFIG, progress=False)
    done = subprocess.run([sys.executable, "-c", DRIVER, str(src), str(tmp_path / "ray")],
                          env={**env, "RAY_ADDRESS": address}, cwd=REPO, capture_output=True, text=True,
                          timeout=170, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert local["counts"]["dropped"]["duplicate"] >= 50
    _same(tmp_path / "local", tmp_path / "ray")
