"""`etl run`'s start: the first chunk is parsed while Polars and the tokenizer load."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import etl.pipeline.resources
import etl.pipeline.run
from etl.config.run_config import RunConfig
from etl.pipeline.run import run as etl_run


def _chats(path: Path, n: int = 20) -> Path:
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_first_chunk_is_parsed_while_the_tokenizer_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    parsed = threading.Event()
    real_builder, real_load = etl.pipeline.run.run_builder, etl.pipeline.resources.load_tokenizer

    def builder(*args):
        out = real_builder(*args)
        parsed.set()
        return out

    def load(*args, **kwargs):
        # Sequential start-up (parse after the tokenizer) would wait here in vain.
        assert parsed.wait(20), "no chunk was parsed while the tokenizer loaded"
        return real_load(*args, **kwargs)

    monkeypatch.setattr(etl.pipeline.run, "run_builder", builder)
    monkeypatch.setattr(etl.pipeline.resources, "load_tokenizer", load)
    manifest = etl_run(str(_chats(tmp_path / "in.jsonl")), str(tmp_path / "out"),
                       RunConfig(tokenizer="bytes", template="chatml"), progress=False)
    assert manifest["counts"]["written"] == 20


def test_timings_show_the_start_up_before_the_first_parse(tmp_path: Path):
    src = _chats(tmp_path / "in.jsonl")
    done = subprocess.run([sys.executable, "-m", "etl", "run", str(src), str(tmp_path / "out"), "--quiet",
                           "--timings"], capture_output=True, text=True, check=True)
    line = next(x for x in done.stderr.splitlines() if x.startswith("etl run timings:"))
    stages = dict(part.strip().rsplit(" ", 1) for part in line.split(":", 1)[1].split(","))
    if sys.platform.startswith("linux"):  # the process's age comes from /proc
        assert float(stages["startup"].rstrip("s")) > 0
