"""Non-finite numbers never pass a config nor reach a JSON file etl writes.

`weight = inf` (TOML) or `1e999` (JSON) in a mixture passed `weight > 0`, mixed 0 records, exited
0 and wrote `NaN` / `Infinity` into the manifest, which no JSON reader accepts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from etl.cli import main
from etl.config.run_config import RunConfig
from etl.errors import EtlError
from etl.mixture.shares import source_targets
from etl.output.writer import _write_json


def _chats(path: Path, n: int) -> str:
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                                     {"role": "assistant", "content": f"a{i}"}]}) + "\n"
                            for i in range(n)), encoding="utf-8")
    return str(path)


def _mixture(tmp_path: Path, weight: str, *, suffix: str) -> Path:
    a, b = _chats(tmp_path / "a.jsonl", 5), _chats(tmp_path / "b.jsonl", 5)
    if suffix == ".toml":
        text = (f'[[sources]]\npath = "{a}"\nweight = {weight}\n'
                f'[[sources]]\npath = "{b}"\nweight = 1\n')
    else:
        text = f'{{"sources": [{{"path": "{a}", "weight": {weight}}}, {{"path": "{b}", "weight": 1}}]}}'
    config = tmp_path / f"mix{suffix}"
    config.write_text(text, encoding="utf-8")
    return config


@pytest.mark.parametrize(("weight", "suffix", "shown"), [
    ("inf", ".toml", "inf"), ("nan", ".toml", "nan"), ("-inf", ".toml", "-inf"),
    ("1e999", ".json", "inf"), ("NaN", ".json", "nan"), ("Infinity", ".json", "inf"),
])
def test_a_non_finite_weight_is_refused_before_anything_is_written(
        tmp_path: Path, weight: str, suffix: str, shown: str, capsys: pytest.CaptureFixture[str]) -> None:
    config = _mixture(tmp_path, weight, suffix=suffix)
    assert main(["run", "--config", str(config), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"config: sources[0].weight must be a positive number, got {shown}" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_every_bounded_number_is_finite() -> None:
    with pytest.raises(EtlError, match=r"split.val_fraction must be in \[0, 1\), got nan"):
        RunConfig(val_fraction=math.nan)


def test_huge_finite_weights_keep_their_shares() -> None:
    """1e308 + 1e308 overflows a float sum: the shares must still be 1/2 each, not 0."""
    targets, shares = source_targets(np.array([100, 300]), weights=np.array([1e308, 1e308]),
                                     epochs=np.array([np.inf, np.inf]), total="sum")
    assert shares.tolist() == [0.5, 0.5] and targets.tolist() == [200.0, 200.0]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_the_manifest_writer_refuses_non_finite_numbers(tmp_path: Path, value: float) -> None:
    """A NaN reaching a manifest is a bug: it must fail loudly, never write invalid JSON."""
    with pytest.raises(ValueError, match="not JSON compliant"):
        _write_json(tmp_path / "_manifest.json", {"counts": {"x": value}})
    assert not (tmp_path / "_manifest.json").exists()
