"""Images read in worker processes (`etl.images.workers`): the same table as `read_images` in this
process, whatever the references; a broken pool read again here; workers only where spawning runs
no code of the main script; and a run with workers byte-identical to one without."""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import time
import types
from pathlib import Path

import pytest

from etl.cli import main
from etl.images import workers as w
from etl.images.read import INLINE, read_images
from tests.images.vl_folder import image_bytes, make_vl_folder


def _refs(folder: Path) -> list[object]:
    """More references than THREAD_IMAGES: files of several formats, a missing one, one that is
    not an image, a data URI, an HF Image dict and raw bytes, repeated."""
    (folder / "img").mkdir()
    for k, (size, mode, fmt) in enumerate([((30, 20), "RGB", "PNG"), ((9, 40), "L", "PNG"),
                                           ((64, 48), "RGB", "JPEG"), ((12, 12), "P", "GIF")]):
        (folder / "img" / f"{k}.{fmt.lower()}").write_bytes(image_bytes(size, mode, fmt))
    (folder / "img" / "broken.png").write_text("not an image")
    uri = "data:image/png;base64," + base64.b64encode(image_bytes((5, 7))).decode()
    one = ["img/0.png", "img/1.png", str(folder / "img" / "2.jpeg"), "img/3.gif", "img/missing.png",
           "img/broken.png", uri, {"bytes": None, "path": "img/1.png"}, image_bytes((3, 4))]
    return one * (2 * w.THREAD_IMAGES // len(one) + 1)


@pytest.fixture
def pool() -> w.ImageWorkers:
    with w.ImageWorkers(2) as workers:
        yield workers


@pytest.mark.parametrize("keep", [False, INLINE])
def test_workers_read_what_read_images_reads(pool: w.ImageWorkers, tmp_path: Path, keep: bool | str) -> None:
    refs = _refs(tmp_path)
    assert len(refs) > w.THREAD_IMAGES
    expected = read_images(refs, base=str(tmp_path), root=None, keep_bytes=keep)
    assert pool.read(refs, base=str(tmp_path), root=None, keep_bytes=keep)() == expected
    assert expected["reason"].null_count < len(refs) and expected["width"].null_count < len(refs)  # both kinds


def test_a_broken_pool_is_read_again_here(pool: w.ImageWorkers, tmp_path: Path) -> None:
    refs = _refs(tmp_path)
    expected = read_images(refs, base=str(tmp_path), root=None, keep_bytes=False)
    pids = [pool._pool.submit(w._ready).result() for _ in range(4)]  # type: ignore[union-attr]
    os.kill(pids[0], signal.SIGKILL)
    assert pool.read(refs, base=str(tmp_path), root=None, keep_bytes=False)() == expected  # submitted, then broke
    with w.ImageWorkers(2) as broken:  # broken before the read is submitted
        os.kill(broken._pool.submit(w._ready).result(), signal.SIGKILL)  # type: ignore[union-attr]
        deadline = time.monotonic() + 30
        while not broken._pool._broken and time.monotonic() < deadline:  # type: ignore[union-attr]
            time.sleep(0.01)
        assert broken.read(refs, base=str(tmp_path), root=None, keep_bytes=False)() == expected
    # later reads stay in this process
    assert pool.read(refs[:70], base=str(tmp_path), root=None, keep_bytes=False)().num_rows == 70


def test_no_workers_where_processes_cannot_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(w, "_spawn_safe", lambda: True)

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(38, "Function not implemented")  # e.g. no /dev/shm for the pool's semaphores

    monkeypatch.setattr(w, "ProcessPoolExecutor", refuse)
    assert w.ImageWorkers.start(1 << 30) is None


def test_object_store_references_stay_in_this_process(pool: w.ImageWorkers, monkeypatch: pytest.MonkeyPatch) -> None:
    assert w._remote("s3://bucket/a.png") and w._remote("gs://b/a.png")
    assert not any(map(w._remote, ["a.png", "/x/a.png", "file:///x/a.png", "data:image/png;base64,AA", None]))
    here: list[tuple[object, ...]] = []
    monkeypatch.setattr(w, "read_images", lambda refs, **kw: here.append((refs, kw["base"])) or "table")
    monkeypatch.setattr(pool, "_pool", None)  # a submit to the workers would fail
    local = ["a.png"] * w.THREAD_IMAGES
    for refs, base in [(local, "s3://bucket/data"), ([*local, "s3://bucket/b.png"], "/data"),
                       ([*local, {"bytes": None, "path": "gs://b/c.png"}], "/data")]:
        assert pool.read(refs, base=base, root=None, keep_bytes=False)() == "table"
    assert len(here) == 3


def test_workers_start_only_where_spawning_runs_no_main_script_code(monkeypatch: pytest.MonkeyPatch) -> None:
    def main_module(**attrs: object) -> types.ModuleType:
        module = types.ModuleType("__main__")
        module.__spec__ = attrs.pop("spec", None)  # type: ignore[assignment]
        for name, value in attrs.items():
            setattr(module, name, value)
        return module

    cli_main = types.SimpleNamespace(__module__="etl.cli")
    cases = {
        "python -m etl": (main_module(spec=types.SimpleNamespace(name="etl.__main__"), __file__="x"), True),
        "python -m some.script": (main_module(spec=types.SimpleNamespace(name="some.script"), __file__="x"), False),
        "python -c / a notebook": (main_module(), True),
        "etl's console script": (main_module(__file__="/venv/bin/etl", main=cli_main), True),
        "a user's script calling etl.cli.main": (main_module(__file__="/home/u/prep.py", main=cli_main), False),
        "a user's script": (main_module(__file__="/home/u/prep.py"), False),
    }
    for name, (module, safe) in cases.items():
        monkeypatch.setitem(sys.modules, "__main__", module)
        assert w._spawn_safe() is safe, name
    monkeypatch.setitem(sys.modules, "__main__", cases["a user's script"][0])
    assert w.ImageWorkers.start(1 << 30) is None
    monkeypatch.setitem(sys.modules, "__main__", cases["python -c / a notebook"][0])
    assert w.ImageWorkers.start(w.WORKERS_FROM_BYTES - 1) is None


@pytest.mark.parametrize("mode", ["embed", "reference"])
def test_a_run_with_workers_writes_what_a_run_without_them_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  mode: str) -> None:
    vl = make_vl_folder(tmp_path / "vl")
    refs = [r for r in _refs(tmp_path) if isinstance(r, str)]
    records = [{"messages": [{"role": "user", "content": "<image>" * (1 + k % 3) + f"Who {k}?"},
                             {"role": "assistant", "content": "A cat."}],
                "images": [refs[(k + j) % len(refs)] for j in range(1 + k % 3)]} for k in range(300)]
    lines = [json.dumps(r) for r in records]
    lines[7] = "{not json"  # a parse reject: the workers' reads skip its record as the run does
    (tmp_path / "data.jsonl").write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(w, "_spawn_safe", lambda: True)
    started: list[w.ImageWorkers | None] = []
    real_start = w.ImageWorkers.start.__func__  # type: ignore[attr-defined]
    outputs = {}
    for name, threshold in (("threads", 1 << 40), ("workers", 0)):
        monkeypatch.setattr(w, "WORKERS_FROM_BYTES", threshold)
        monkeypatch.setattr(w.ImageWorkers, "start", classmethod(
            lambda cls, size: started.append(real_start(cls, size)) or started[-1]))
        dst = tmp_path / name
        assert main(["run", str(tmp_path / "data.jsonl"), str(dst), "--tokenizer", str(vl), "--quiet",
                     "--images", mode, "--chunk-mb", "0.01", "--no-cache"]) == 0
        outputs[name] = {p.relative_to(dst): p.read_bytes() for p in sorted(dst.rglob("*")) if p.is_file()}
    assert started[0] is None and started[1] is not None
    assert outputs["workers"] == outputs["threads"]
    manifest = json.loads(outputs["workers"][Path("_manifest.json")])
    first_bad = [next((ref for ref in r["images"] if "missing" in ref or "broken" in ref), None)
                 for k, r in enumerate(records) if k != 7]
    assert manifest["counts"]["rejected"] == {"invalid_json": 1,
                                              "missing_image": sum("missing" in (b or "") for b in first_bad),
                                              "unreadable_image": sum("broken" in (b or "") for b in first_bad)}
