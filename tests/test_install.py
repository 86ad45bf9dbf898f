"""The editable install (`make venv`) against a namespace package of the same name: run from the
folder that holds a clone named etl/, `import etl` must still give the installed package."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, check=False)


def test_a_folder_named_etl_in_the_working_directory_does_not_shadow_etl(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if _python("import etl", elsewhere).returncode != 0:
        pytest.skip("etl is not installed in this interpreter (run through PYTHONPATH)")
    (tmp_path / "etl" / "sub").mkdir(parents=True)  # a clone's folder: no etl/__init__.py here
    done = _python("import etl; print(etl.__version__, etl.__file__)", tmp_path)
    assert done.returncode == 0, done.stderr
    version, where = done.stdout.split()
    assert version and Path(where).name == "__init__.py"
    assert tmp_path.resolve() not in Path(where).resolve().parents
