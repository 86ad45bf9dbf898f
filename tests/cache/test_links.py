"""No file under the token cache is written, touched or deleted through a symlink: a link
planted at any path etl writes or removes there makes a run go on without the cache, with one
warning naming the link (the cache is an optimisation, as on a full disk), and makes `etl cache
clear` refuse, naming it, before it removes a single file. Nothing outside the cache changes:
the folder the links point into is hashed, bytes and modification times, before and after."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from etl.cache import folder as fo
from etl.cache.segments import write_segment
from etl.cache.store import SegmentStore
from etl.cli import main
from etl.safe_paths import SymlinkRefused
from tests.cache.common import all_files, chats, output_digests, write_jsonl

# Where a link is planted, relative to the cache root (`NS`: the run's namespace folder).
PLANTS = {
    "parsed folder": fo.PARSED_DIR,
    "namespace folder": "NS",
    "run log": fo.RUNS_LOG,
    "key": f"NS/{fo.KEY_FILE}",
    "answers": f"NS/{fo.ANSWERS_FILE}",
    "segment": "NS/SEGMENT",
    "parsed chunk": f"{fo.PARSED_DIR}/CHUNK",
    "marker": fo.MARKER,
}


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_path: Path) -> tuple[Path, Path]:
    """(SRC, a cache a cold run filled); copied by each test, which changes its copy."""
    base = tmp_path_factory.mktemp("filled")
    src = write_jsonl(base / "src" / "chats.jsonl", chats(30)).parent
    assert main(["run", str(src), str(base / "plain"), "--quiet", "--no-cache", *run_flags(tiny_tokenizer_path)]) == 0
    assert main(["run", str(src), str(base / "cold"), "--quiet", "--cache", str(base / "cache"),
                 *run_flags(tiny_tokenizer_path)]) == 0
    return src, base


def run_flags(tokenizer: Path) -> list[str]:
    return ["--tokenizer", str(tokenizer), "--template", "chatml"]


def tree_digest(folder: Path) -> str:
    """Every entry under folder: name, kind, bytes and modification time (a `utime` shows too)."""
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        h.update(f"{p.relative_to(folder)}|{st.st_mode}|{st.st_mtime_ns}|".encode())
        if p.is_file() and not p.is_symlink():
            h.update(p.read_bytes())
    return h.hexdigest()


def plant(cache: Path, where: str, outside: Path) -> Path:
    """Move the cache's file or folder at `where` outside, and put a link to it in its place."""
    (space,) = fo.namespaces(cache)
    path = cache / where.replace("NS", space.name)
    if path.name == "SEGMENT":
        path = fo.segments(cache)[0]
    elif path.name == "CHUNK":
        path = fo.parsed_files(cache)[0]
    target = outside / path.name
    shutil.move(path, target)
    path.symlink_to(target, target_is_directory=target.is_dir())
    return path


@pytest.mark.parametrize("where", PLANTS)
def test_a_link_in_the_cache_turns_it_off_and_clear_refuses(
        where: str, filled: tuple[Path, Path], tiny_tokenizer_path: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    src, base = filled
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    shutil.copytree(base / "cache", cache)
    outside.mkdir()
    link = plant(cache, PLANTS[where], outside)
    before, cached = tree_digest(outside), all_files(cache)
    capsys.readouterr()

    assert main(["run", str(src), str(tmp_path / "d"), "--quiet", "--cache", str(cache),
                 *run_flags(tiny_tokenizer_path)]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines()
                if "warning" in line and "spell a control token" not in line]  # the fixtures spell <|im_end|>
    assert len(warnings) == 1 and str(link) in warnings[0] and "goes on without it" in warnings[0], warnings
    assert output_digests(tmp_path / "d") == output_digests(base / "plain")
    assert tree_digest(outside) == before

    assert main(["cache", "clear", "--cache", str(cache)]) == 2
    err = capsys.readouterr().err
    assert str(link) in err and "symlink" in err, err
    assert tree_digest(outside) == before and all_files(cache) == cached


def test_eviction_and_the_segment_store_never_go_through_a_link(tmp_path: Path) -> None:
    """`evict` (of a segment, and of a stale temporary file) and opening a namespace's segments,
    with the file a link: refused, naming it; the file it points to stays, mtime included."""
    root = fo.open_root(tmp_path / "cache")
    space = fo.namespace(root, "k")
    outside = tmp_path / "outside"
    outside.mkdir()
    keys = np.array([[1, 2]], np.uint64)
    seg = write_segment(space, keys, pa.array([[1, 2, 3]], pa.large_list(pa.int32())))
    shutil.move(seg, outside / seg.name)
    seg.symlink_to(outside / seg.name)
    before = tree_digest(outside)
    with pytest.raises(SymlinkRefused, match=str(seg)):
        fo.evict(root, 0)
    with pytest.raises(SymlinkRefused, match=str(seg)):
        SegmentStore(space, root)
    assert tree_digest(outside) == before

    seg.unlink()
    tmp = space / f"{fo.TMP_PREFIX}1-x.parquet"
    (outside / "victim").write_bytes(b"x")
    tmp.symlink_to(outside / "victim")
    os.utime(tmp, (0, 0), follow_symlinks=False)  # the link looks stale: a crashed writer's
    before = tree_digest(outside)
    with pytest.raises(SymlinkRefused, match=str(tmp)):
        fo.evict(root, 0)
    assert tree_digest(outside) == before
