"""`--ray-address` that no Ray cluster answers: ray.init retried for ~14 minutes
inside C++ calls that held off Ctrl-C. etl gives up after `--ray-timeout` seconds with one line
naming the address, and Ctrl-C ends the wait at once.

Each case runs `etl run` in a subprocess (its abandoned connection attempt dies with it), with
HOME and Ray's temp dir in a temporary folder.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def env() -> Iterator[dict[str, str]]:
    """The CLI's environment: no RAY_* (a cluster fixture's RAY_ADDRESS, RAY_AUTH_MODE), HOME and
    Ray's temp dir (short: socket paths) apart."""
    home = Path(tempfile.mkdtemp(prefix="etl-rc-"))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    yield {**clean, "HOME": str(home), "RAY_TMPDIR": str(home), "PYTHONPATH": str(REPO)}
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture()
def silent_port() -> Iterator[socket.socket]:
    """A TCP port that accepts connections and never answers: not a Ray GCS."""
    with socket.create_server(("", 0)) as server:
        server.settimeout(60)
        yield server


@pytest.fixture()
def http_port() -> Iterator[int]:
    """A port that answers every connection with an HTTP 404 at once (a proxy, a web server): Ray's
    GCS client logs a `gcs_client.cc` warning per retry, one a second, past Python's logging."""
    server = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def _etl(tmp_path: Path, address: str, timeout: str) -> list[str]:
    src = tmp_path / "raw.jsonl"
    src.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    return [sys.executable, "-m", "etl", "run", str(src), str(tmp_path / "d"), "--engine", "ray",
            "--ray-address", address, "--ray-timeout", timeout]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


def test_nothing_listening_fails_at_once_naming_the_address(tmp_path: Path, env: dict[str, str]) -> None:
    address = f"127.0.0.1:{_free_port()}"
    done = subprocess.run(_etl(tmp_path, address, "20"), env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"etl run: error: --engine ray: cannot reach {address} (--ray-address): ")
    assert "refused" in last and "ray start --head" in last and "drop --ray-address" in last
    assert "Failed to connect to GCS" not in done.stderr  # Ray never tried: the TCP probe answered
    assert not (tmp_path / "d" / "_manifest.json").exists()


def test_a_port_that_is_not_ray_fails_after_the_timeout(
    tmp_path: Path, env: dict[str, str], silent_port: socket.socket,
) -> None:
    address = f"127.0.0.1:{silent_port.getsockname()[1]}"
    done = subprocess.run(_etl(tmp_path, address, "1"), env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"etl run: error: --engine ray: {address} (--ray-address) accepts connections but no Ray "
                    "cluster answered within 1 s; start one there (`ray start --head --port PORT` prints the "
                    "address to pass), drop --ray-address to run on a local Ray, or raise --ray-timeout")


def test_ctrl_c_stops_the_wait_at_once(tmp_path: Path, env: dict[str, str], silent_port: socket.socket) -> None:
    address = f"127.0.0.1:{silent_port.getsockname()[1]}"
    proc = subprocess.Popen(_etl(tmp_path, address, "600"), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        with silent_port.accept()[0], silent_port.accept()[0]:  # etl's probe, then Ray's GCS client
            proc.send_signal(signal.SIGINT)  # ray.init is waiting now
            _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "etl run: interrupted"


def test_a_timeout_must_be_positive() -> None:
    from etl.engine.ray_connect import check_timeout
    from etl.errors import EtlError

    check_timeout(0.5)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(EtlError, match=r"^--ray-timeout is .*; pass a positive number of seconds"):
            check_timeout(bad)



def test_a_port_that_answers_but_is_not_ray_fails_in_one_line(tmp_path: Path, env: dict[str, str],
                                                              http_port: int) -> None:
    address = f"127.0.0.1:{http_port}"
    done = subprocess.run(_etl(tmp_path, address, "4"), env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr  # Ray's retries held: etl's line alone
    assert done.stderr.startswith(f"etl run: error: --engine ray: {address} (--ray-address) accepts connections")
