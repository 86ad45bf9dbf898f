"""Links and other entries under SRC that are not plain files:
each real file is read once, discovery ends, and whatever is not read is counted with a reason."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from etl.cli import main
from etl.errors import EtlWarning
from etl.ingest.discover import NOT_READ, discover
from etl.output.manifest import read_manifest


def _write(path: Path, n: int, tag: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"messages": [{"role": "user", "content": f"{tag} q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _found(src: Path | str) -> tuple[list[tuple[str, str, str | None]], list[str]]:
    """(name, kind, reason) of SRC's sources, and the warnings discovery gave."""
    with pytest.warns(EtlWarning) as caught:
        sources = discover(str(src))
    return [(s.name, s.kind, s.reason) for s in sources], [str(w.message) for w in caught]


def _run(src: Path | str, dst: Path) -> tuple[int, dict]:
    return main(["run", str(src), str(dst), "--quiet"]), read_manifest(dst)


def test_a_symlink_loop_is_read_once_counted_and_discovery_ends(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "s"
    _write(src / "a.jsonl", 5, "a")
    (src / "sub").mkdir()
    (src / "sub" / "up").symlink_to("..")  # read every record 41 times
    (src / "loop").symlink_to("../s")  # with `up`: os.walk never ended
    expected = [("a.jsonl", "jsonl", None), ("loop/", NOT_READ, "symlink_loop"),
                ("sub/up/", NOT_READ, "symlink_loop")]
    found, warned = _found(src)
    assert found == expected and len(warned) == 2
    assert warned[1] == f"sub/up/: skipped, a link to {src}, a folder that holds it (a loop); counted as rejected (symlink_loop)"
    assert _found(src / "**" / "*.jsonl")[0] == expected  # a glob over the loops ends too
    status, manifest = _run(src, tmp_path / "out")
    assert "sub/up/: skipped" in capsys.readouterr().err  # --quiet or not
    counts = manifest["counts"]
    assert (counts["read"], counts["written"], counts["rejected"]) == (7, 5, {"symlink_loop": 2})
    assert status == 0 and manifest["incomplete_inputs"] == []  # nothing was lost: all of it was read
    rejects = pq.read_table(tmp_path / "out" / "_rejects").to_pylist()
    assert sorted((r["source_file"], r["reason"]) for r in rejects) == [
        ("loop/", "symlink_loop"), ("sub/up/", "symlink_loop")]
    assert all(str(src) in r["detail"] for r in rejects)  # names where the link leads


def test_a_file_reached_by_two_links_is_read_once(tmp_path: Path) -> None:
    data = _write(tmp_path / "datasets" / "x.jsonl", 3, "x").parent  # linked in from outside SRC
    src = tmp_path / "s"
    _write(src / "own.jsonl", 2, "own")
    (src / "l1").symlink_to(data)
    (src / "l2").symlink_to(data)
    (src / "same.jsonl").symlink_to("own.jsonl")
    found, warned = _found(src)
    assert "already read as" in warned[0] and "same.jsonl: skipped, the same file as own.jsonl" in warned[1]
    assert found == [("l1/x.jsonl", "jsonl", None), ("l2/", NOT_READ, "already_read"),
                     ("own.jsonl", "jsonl", None), ("same.jsonl", NOT_READ, "already_read")]
    status, manifest = _run(src, tmp_path / "out")
    counts = manifest["counts"]
    assert (counts["read"], counts["written"], counts["rejected"]) == (7, 5, {"already_read": 2})
    assert status == 0 and manifest["incomplete_inputs"] == []


def test_dangling_links_and_fifos_are_counted_never_opened(tmp_path: Path) -> None:
    src = tmp_path / "s"
    _write(src / "a.jsonl", 2, "a")
    (src / "gone.jsonl").symlink_to("nowhere.jsonl")
    os.mkfifo(src / "pipe.jsonl.gz")  # opening it for reading would block for ever
    (src / "notes").symlink_to("nowhere")  # not an input name: not counted, as a .txt file is not
    assert main(["run", str(src), str(tmp_path / "out"), "--quiet"]) == 3
    manifest = read_manifest(tmp_path / "out")
    counts = manifest["counts"]
    assert (counts["read"], counts["written"], counts["rejected"]) == (4, 2, {"unreadable_file": 2})
    lost = {i["path"]: i["error"] for i in manifest["incomplete_inputs"]}
    assert set(lost) == {"gone.jsonl", "pipe.jsonl.gz"}
    assert "missing" in lost["gone.jsonl"] and "FIFO" in lost["pipe.jsonl.gz"]
    # SRC itself a dangling link: counted the same way, not "no input files" (exit 4: nothing written).
    assert main(["run", str(src / "gone.jsonl"), str(tmp_path / "one"), "--quiet"]) != 0
    assert read_manifest(tmp_path / "one")["counts"]["rejected"] == {"unreadable_file": 1}
