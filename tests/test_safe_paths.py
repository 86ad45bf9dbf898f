"""etl.safe_paths: a path below a root is refused when any component below the root is a symlink."""

from __future__ import annotations

import os

import pytest

from etl.safe_paths import SymlinkRefused, check_no_symlink, open_nofollow


def test_real_paths_pass_and_missing_components_are_fine(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert check_no_symlink(tmp_path / "a" / "b" / "c.parquet", tmp_path) == tmp_path / "a" / "b" / "c.parquet"
    assert check_no_symlink(tmp_path / "new" / "deeper" / "x", tmp_path) == tmp_path / "new" / "deeper" / "x"
    assert check_no_symlink(tmp_path, tmp_path) == tmp_path


@pytest.mark.parametrize("link", ["a", "a/b", "a/b/c.parquet"])
def test_a_link_at_any_depth_is_named(tmp_path, link):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "dst"
    parent = (root / link).parent
    parent.mkdir(parents=True, exist_ok=True)
    (root / link).symlink_to(outside)
    with pytest.raises(SymlinkRefused, match=f"symlink {root / link} "):
        check_no_symlink(root / "a" / "b" / "c.parquet", root)


def test_the_root_itself_may_be_a_link(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "dst").symlink_to(tmp_path / "real")
    check_no_symlink(tmp_path / "dst" / "data" / "x", tmp_path / "dst")


def test_open_nofollow_refuses_a_link_and_leaves_its_target(tmp_path):
    target = tmp_path / "victim.txt"
    target.write_text("mine")
    root = tmp_path / "dst"
    root.mkdir()
    (root / "_lock").symlink_to(target)
    with pytest.raises(SymlinkRefused, match="_lock"):
        open_nofollow(root / "_lock", os.O_RDWR | os.O_CREAT | os.O_TRUNC, root)
    assert target.read_text() == "mine"
    fd = open_nofollow(root / "_real", os.O_RDWR | os.O_CREAT, root)
    os.close(fd)
    assert (root / "_real").is_file()
