"""No writer goes through a symlink below its folder.

Every writer (`etl run` and its rerun, `etl pack`, `etl export` in each format) is run with a link planted at each path it would write or delete, pointing into a
sibling folder `outside`: it must exit 2 naming the link, and leave `outside` byte for byte as it
was. The link's target holds what etl would have deleted or overwritten (the real part files).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from etl import columns as c
from etl.cli import main
from etl.output.lock import FolderLock
from etl.output.writer import OutputWriter
from etl.safe_paths import SymlinkRefused
from tests.commands.test_run_cli import EXAMPLES

DOMAIN = "__default__"  # examples/raw has no domain key
# folder -> the command that (re)writes it; {x} are folders of the case's copy of the base.
WRITERS = {
    "run": ("d", ["run", str(EXAMPLES), "{d}", "--quiet", "--no-cache"]),
    "pack": ("d", ["pack", "{d}", "--strategy", "bfd", "--seq-len", "512"]),
    **{f: (f"o_{f}", ["export", "{d}", f"{{o_{f}}}", "--format", f]) for f in ("episodes", "bin", "h5")},
}
PART = "part-00000.parquet"
# (writer, path below its folder where the link goes, how the folder is prepared):
#   rerun   - the folder as the writer left it: the link replaces what its record lists (removal)
#   fresh   - what the writer would replace is gone (an empty journal keeps the folder etl's):
#             the link is met by the writes, not the removal
#   staging - an interrupted writer's journal lists `_staging`, which is a link
CASES = [
    *[("run", rel, "rerun") for rel in (
        "data", "data/train", "turns/train", c.REJECTS_DIR, "packs/train", f"data/train/{PART}",
        f"{c.REJECTS_DIR}/{PART}", f"data/train/.{PART}.tmp", c.MANIFEST_FILE, c.CARD_FILE,
        c.PACKS_FILE, c.LOCK_FILE, c.JOURNAL_FILE)],
    *[("run", rel, "fresh") for rel in (
        "data", "data/train", "turns", c.REJECTS_DIR, f"data/train/{PART}", f"data/train/.{PART}.tmp",
        c.MANIFEST_FILE, f".{c.MANIFEST_FILE}.tmp", f".{c.CARD_FILE}.tmp", c.LOCK_FILE)],
    ("run", c.STAGING_DIR, "staging"),
    *[("pack", rel, "rerun") for rel in (
        "packs", "packs/train", f"packs/train/{PART}", c.PACKS_FILE, c.LOCK_FILE, c.JOURNAL_FILE)],
    *[("pack", rel, "fresh") for rel in ("packs", "packs/train", f"packs/train/{PART}", c.PACKS_FILE)],
    *[(f, rel, mode) for f, rels in (
        ("episodes", ("train", "train/tokens.bin", "train/.mask.bin.tmp", "meta.json")),
        ("bin", (DOMAIN, f"{DOMAIN}/.offsets-00000.bin.tmp", f"{DOMAIN}/loss_mask.bin",
                 f"{DOMAIN}/sequence.bin", f"{DOMAIN}/meta.json")),
        ("h5", (DOMAIN, f"{DOMAIN}/.data-00000.h5.tmp", f"{DOMAIN}/data.h5")),
    ) for rel in (*rels, c.EXPORT_FILE, c.LOCK_FILE, c.JOURNAL_FILE) for mode in ("rerun", "fresh")
      if not (mode == "fresh" and rel == c.JOURNAL_FILE)],
]


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under root: files by sha256, folders and links by kind (new ones show too)."""
    def kind(p: Path) -> str:
        if p.is_symlink():
            return "link -> " + os.readlink(p)
        return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "folder"
    return {p.relative_to(root).as_posix(): kind(p) for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run (packed) and an export in each format of the run."""
    base = tmp_path_factory.mktemp("base")
    for name in ("run", "pack", "episodes", "bin", "h5"):
        assert main(_argv(name, base)) == 0, name
    return base


def _argv(writer: str, base: Path) -> list[str]:
    names = {"d": base / "d", **{f"o_{f}": base / f"o_{f}" for f in ("episodes", "bin", "h5")}}
    return [a.format(**names) for a in WRITERS[writer][1]]


def _prepare(folder: Path, writer: str, mode: str) -> None:
    """Make `folder` as `mode` says (see CASES)."""
    if mode == "fresh":
        gone = [c.PACKS_FILE, c.PACKS_DIR] if writer == "pack" else [p.name for p in folder.iterdir()]
        for name in gone:
            path = folder / name
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        (folder / c.JOURNAL_FILE).write_text("")
    elif mode == "staging":
        (folder / c.JOURNAL_FILE).write_text(json.dumps({"path": c.STAGING_DIR}) + "\n")


def _plant(folder: Path, rel: str, outside: Path) -> Path:
    """Move what is at `rel` (if anything) into `outside`, and link `rel` to it there."""
    link, target = folder / rel, outside / rel.replace("/", "_")
    if link.exists():
        shutil.move(link, target)
    elif "." not in rel.rsplit("/", 1)[-1] and rel != c.LOCK_FILE:  # a folder
        (target / "sub").mkdir(parents=True)
        (target / "sub" / PART).write_text("mine")
    else:
        target.write_text("mine\n")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return link


@pytest.mark.parametrize(("writer", "rel", "mode"), CASES, ids=[f"{w}-{m}-{r}" for w, r, m in CASES])
def test_no_writer_goes_through_a_symlink(base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          writer: str, rel: str, mode: str) -> None:
    work = tmp_path / "w"
    shutil.copytree(base, work, symlinks=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "notes.txt").write_text("the user's")
    folder = work / WRITERS[writer][0]
    _prepare(folder, writer, mode)
    link = _plant(folder, rel, outside)
    before, target = snapshot(outside), os.readlink(link)
    capsys.readouterr()

    assert main(_argv(writer, work)) == 2
    err = capsys.readouterr().err
    assert f"symlink {link} " in err, err
    assert snapshot(outside) == before
    assert os.readlink(link) == target  # the link itself is left for the user to remove


def test_a_writer_with_a_clean_folder_still_works(base: Path, tmp_path: Path) -> None:
    """The checks refuse links only: every writer reruns over its own output."""
    work = tmp_path / "w"
    shutil.copytree(base, work, symlinks=True)
    for writer in ("run", "pack", "episodes", "bin", "h5"):
        assert main(_argv(writer, work)) == 0, writer


def test_the_output_folder_itself_may_be_a_link(base: Path, tmp_path: Path) -> None:
    real = tmp_path / "real"
    shutil.copytree(base / "d", real, symlinks=True)
    (tmp_path / "d").symlink_to(real)
    assert main(["run", str(EXAMPLES), str(tmp_path / "d"), "--quiet", "--no-cache"]) == 0
    assert (real / c.MANIFEST_FILE).is_file() and not (real / c.LOCK_FILE).exists()


def test_the_lock_is_never_opened_through_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("mine")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / c.LOCK_FILE).symlink_to(victim)
    with pytest.raises(SymlinkRefused, match=f"symlink {tmp_path / 'd' / c.LOCK_FILE} "):
        FolderLock(tmp_path / "d").acquire()
    assert victim.read_text() == "mine"


def test_releasing_the_lock_removes_only_the_file_it_locked(tmp_path: Path) -> None:
    """Someone replaced `_lock` while it was held: release leaves the new one alone."""
    lock = FolderLock(tmp_path)
    lock.acquire()
    (tmp_path / c.LOCK_FILE).unlink()
    (tmp_path / c.LOCK_FILE).write_text("not etl's")
    lock.release()
    assert (tmp_path / c.LOCK_FILE).read_text() == "not etl's"
    lock.acquire()
    lock.release()
    assert not (tmp_path / c.LOCK_FILE).exists()


def test_a_record_amended_through_a_link_is_refused(base: Path, tmp_path: Path) -> None:
    """`amend` rewrites another writer's record (the run manifest, from `etl pack`)."""
    work = tmp_path / "w"
    shutil.copytree(base, work, symlinks=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    link = _plant(work / "d", c.MANIFEST_FILE, outside)
    before = snapshot(outside)
    with OutputWriter(work / "d", kind="pack") as output, pytest.raises(SymlinkRefused, match=f"symlink {link} "):
        output.amend("run", "note", 1)
    assert snapshot(outside) == before and link.is_symlink()


def test_a_rerun_refuses_before_it_removes_anything(base: Path, tmp_path: Path) -> None:
    """A link deep in the record stops the removal before its first file: the output stays whole."""
    work = tmp_path / "w"
    shutil.copytree(base, work, symlinks=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    _plant(work / "d", f"turns/train/{PART}", outside)
    before = snapshot(work / "d")
    with pytest.raises(SymlinkRefused):
        OutputWriter(work / "d", kind="run").__enter__()
    after = snapshot(work / "d")
    assert {k: v for k, v in after.items() if k != c.JOURNAL_FILE} == before
