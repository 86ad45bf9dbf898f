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
from etl.errors import EXIT_ERROR
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


# A whole run in a fresh interpreter (another test's imports would hide one the run made): gigatoken
# encodes (its check against `tokenizers` included), turns are assembled and parts written.
NO_PANDAS = """
import sys
from etl.cli import main
assert "pandas" not in sys.modules, "imported before the run"
status = main(["run", sys.argv[1], sys.argv[2], "--quiet", "--no-cache", "--tokenizer", sys.argv[3],
               "--template", "chatml", "--tokenizer-backend", "gigatoken"])
print(status, "pandas" in sys.modules)
"""


def test_a_run_through_gigatoken_imports_no_pandas(tmp_path: Path):
    """pyarrow's `to_numpy`, `pa.array` of a numpy array and `Schema.empty_table` import pandas
    (~0.13 s of the GIL on a warm disk): a run's own steps read and make Arrow buffers instead."""
    pytest.importorskip("pandas")  # without pandas installed there is nothing to import
    pytest.importorskip("gigatoken")
    from tests.cache.common import chats, train_tokenizer, write_jsonl

    src = write_jsonl(tmp_path / "in.jsonl", chats(50))
    tok = train_tokenizer(tmp_path / "tok" / "tokenizer.json")
    done = subprocess.run([sys.executable, "-c", NO_PANDAS, str(src), str(tmp_path / "out"), str(tok)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "False"]


EXITING = """
import atexit, sys
atexit.register(lambda: print("atexit handler ran"))
sys.argv = ["etl", *sys.argv[1:]]
from etl.cli import entry
entry()
print("not reached: entry() ends the process")
"""


def test_the_console_entry_exits_with_mains_status_after_the_atexit_handlers(tmp_path: Path):
    """`entry` (the console script, `python -m etl`) skips the interpreter's teardown, not the
    atexit handlers (Ray's shutdown), the buffered output or the exit status."""
    src = _chats(tmp_path / "in.jsonl")
    ran = subprocess.run([sys.executable, "-c", EXITING, "run", str(src), str(tmp_path / "out"), "--quiet"],
                         capture_output=True, text=True, check=False)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["atexit handler ran"]
    stats = subprocess.run([sys.executable, "-m", "etl", "stats", str(tmp_path / "out")],
                           capture_output=True, text=True, check=False)
    assert stats.returncode == 0 and "20" in stats.stdout  # stdout is a pipe: block-buffered, flushed
    failed = subprocess.run([sys.executable, "-c", EXITING, "run", str(tmp_path / "missing.jsonl"),
                             str(tmp_path / "out2"), "--quiet"], capture_output=True, text=True, check=False)
    assert failed.returncode == EXIT_ERROR and "error" in failed.stderr
    assert failed.stdout.splitlines() == ["atexit handler ran"]


_DECAY = """
import ctypes, sys
import etl, duckdb
lib = ctypes.CDLL(duckdb._duckdb.__file__)
if not hasattr(lib, "duckdb_je_mallctl"):
    sys.exit(3)  # a DuckDB build without its jemalloc (macOS, Windows)
value, size = ctypes.c_ssize_t(), ctypes.c_size_t(ctypes.sizeof(ctypes.c_ssize_t))
for name in (b"opt.dirty_decay_ms", b"opt.muzzy_decay_ms"):
    assert lib.duckdb_je_mallctl(name, ctypes.byref(value), ctypes.byref(size), None, 0) == 0
    print(value.value)
"""


@pytest.mark.parametrize(("preset", "expected"), [(None, ["250", "0"]), ("dirty_decay_ms:700", ["700", "1000"])])
def test_duckdbs_allocator_returns_freed_pages_within_250_ms_unless_the_user_said_otherwise(
        preset: str | None, expected: list[str], monkeypatch: pytest.MonkeyPatch):
    # Held 1 s dirty and 1 s as MADV_FREE pages (DuckDB's own defaults), a parse thread's freed
    # pages stayed resident between chunks: ~220 MiB of T0 x10's peak.
    monkeypatch.delenv("DUCKDB_JE_MALLOC_CONF", raising=False)
    if preset is not None:
        monkeypatch.setenv("DUCKDB_JE_MALLOC_CONF", preset)
    done = subprocess.run([sys.executable, "-c", _DECAY], check=False, capture_output=True, text=True, timeout=60)
    if done.returncode == 3:
        pytest.skip("this DuckDB build has no jemalloc of its own")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == expected
