"""Optional dependencies: a command that needs a missing one says how to install it, in one
`etl CMD: error: ...` line; the commands that do not need one run without it.

A module is made missing in a fresh interpreter by `sys.modules[name] = None`, which makes
`import name` (and `import name.sub`) raise ImportError as an uninstalled package does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from etl.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "raw"
OPTIONAL = ("matplotlib", "h5py", "nbclient", "nbformat", "ray")


def etl_without(missing: tuple[str, ...], *argvs: list[str]) -> subprocess.CompletedProcess[str]:
    """Run `etl ARGV` for each argv in one interpreter where the `missing` modules cannot be
    imported; stdout ends with the list of exit statuses."""
    code = (
        "import sys\n"
        f"for name in {list(missing)!r}:\n"
        "    sys.modules[name] = None\n"
        "from etl.cli import main\n"
        f"print([main(argv) for argv in {[list(a) for a in argvs]!r}])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env=env, check=False, timeout=300)


def statuses(proc: subprocess.CompletedProcess[str]) -> list[int]:
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("sample")
    assert main(["run", str(EXAMPLES), str(dst), "--quiet"]) == 0
    return dst


def test_report_without_matplotlib_names_the_extra(sample: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    proc = etl_without(("matplotlib",), ["report", str(sample), "-o", str(out)])
    assert statuses(proc) == [2]
    assert proc.stderr == (
        "etl report: error: the report's plots need matplotlib: "
        "pip install 'etl[report]' (or matplotlib)\n"
    )
    assert not out.exists()


def test_h5_export_without_h5py_names_the_extra(sample: Path, tmp_path: Path) -> None:
    """h5py is checked before OUT is claimed, so OUT is not even created."""
    proc = etl_without(("h5py",), ["export", str(sample), str(tmp_path / "h5"), "--format", "h5"])
    assert statuses(proc) == [2]
    assert proc.stderr == (
        "etl export: error: storage_format h5 needs h5py: pip install 'etl[h5]' (or h5py)\n"
    )
    assert not (tmp_path / "h5").exists()


def test_commands_run_without_the_optional_dependencies_and_torch(sample: Path, tmp_path: Path) -> None:
    """torch is the training loader's alone: no command imports it."""
    proc = etl_without(
        (*OPTIONAL, "torch"),
        ["run", str(EXAMPLES), str(tmp_path / "run"), "--quiet"],
        ["stats", str(sample)],
        ["inspect", str(sample), "--row", "0", "--plain"],
        ["export", str(sample), str(tmp_path / "bin"), "--format", "bin"],
        ["export", str(sample), str(tmp_path / "episodes"), "--format", "episodes"],
    )
    assert statuses(proc) == [0, 0, 0, 0, 0], proc.stderr
    assert "torch" not in proc.stderr and "Traceback" not in proc.stderr


def test_h5_run_config_without_h5py_names_the_extra(tmp_path: Path) -> None:
    """A config's `output.storage_format = "h5"` (the export stage after the run) without h5py is
    refused in one line naming the extra, before the tokenizer loads, so DST stays untouched."""
    config = tmp_path / "h5.json"
    config.write_text(json.dumps({"output": {"storage_format": "h5"}}))
    dst = tmp_path / "run"
    proc = etl_without(("h5py",), ["run", str(EXAMPLES), str(dst), "--config", str(config), "--quiet"])
    assert statuses(proc) == [2]
    assert proc.stderr == "etl run: error: storage_format h5 needs h5py: pip install 'etl[h5]' (or h5py)\n"
    assert not dst.exists()


def test_ray_engine_without_ray_names_the_extra(tmp_path: Path) -> None:
    """The local engine never imports ray (above); `--engine ray` without it is one line."""
    dst = tmp_path / "run"
    proc = etl_without(("ray",), ["run", str(EXAMPLES), str(dst), "--engine", "ray", "--quiet"])
    assert statuses(proc) == [2]
    assert proc.stderr == "etl run: error: --engine ray needs Ray Data: pip install 'etl[ray]' (or 'ray[data]')\n"
    assert not dst.exists()
