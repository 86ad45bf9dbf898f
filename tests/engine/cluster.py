"""A local Ray cluster for a test module: HOME and Ray's temp dir in a short temporary folder
(Ray's socket paths have a length limit), fake S3 credentials the workers inherit, and a file
lock so that two xdist workers never run clusters at once."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ingest.s3_server import s3_environment

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def cluster_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A short, empty HOME for one cluster (Ray 2.60 writes ~/.ray/auth_token there), held under the
    tests' Ray lock and removed after."""
    with open(tmp_path_factory.getbasetemp().parent / "etl-ray.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other xdist worker's cluster is gone first
        home = Path(tempfile.mkdtemp(prefix="etl-ray-"))
        try:
            yield home
        finally:
            shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def local_cluster(tmp_path_factory: pytest.TempPathFactory, cpus: int) -> Iterator[dict[str, str]]:
    """A `cpus`-CPU cluster in this process (`ray.init`); yields the environment a driver
    subprocess joins it with."""
    import ray

    with cluster_home(tmp_path_factory) as home:
        old_home = os.environ.get("HOME")
        os.environ["HOME"] = str(home)
        aws = pytest.MonkeyPatch()  # the workers inherit it: fake credentials for the s3:// SRC test
        for name, value in s3_environment(home).items():
            aws.setenv(name, value)
        try:
            info = ray.init(num_cpus=cpus, _temp_dir=str(home / "t"), include_dashboard=False,
                            configure_logging=False, log_to_driver=False)
            yield {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO), "RAY_ADDRESS": info.address_info["address"]}
        finally:
            ray.shutdown()
            aws.undo()
            os.environ["HOME"] = old_home if old_home is not None else ""
