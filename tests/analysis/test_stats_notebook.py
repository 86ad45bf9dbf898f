"""notebooks/token_stats.ipynb runs top to bottom on an etl output (nbclient, real kernel)."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest

from tests.analysis.stats_fixtures import REPO

NOTEBOOK = REPO / "notebooks" / "token_stats.ipynb"


def execute(dst: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Run the notebook with ETL_DST=dst; return the outputs of every code cell, flattened."""
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("ETL_DST", str(dst))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]


def text_of(outputs: list[dict]) -> str:
    parts = [o.get("text", "") for o in outputs]
    parts += [o.get("data", {}).get("text/plain", "") for o in outputs]
    return "\n".join(parts)


def test_notebook_runs_on_the_fixture(
    dst: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.image as mpimg

    outputs = execute(dst, tmp_path, monkeypatch)
    assert not [o for o in outputs if o.output_type == "error"]
    text = text_of(outputs)
    assert "accounting gap (must be 0): 0" in text
    assert "num_trained agrees with loss_mask: True" in text
    assert "examples without trained tokens: 1" in text  # ex-code-2
    assert "<|asst|>[[4.<|eot|>]]" in text  # the inspect cell on train row 0
    pngs = [o.data["image/png"] for o in outputs if "image/png" in o.get("data", {})]
    assert len(pngs) == 2
    for png in pngs:
        image = mpimg.imread(io.BytesIO(base64.b64decode(png)), format="png")[..., :3]
        assert (image < 0.9).any(axis=-1).mean() > 0.01
