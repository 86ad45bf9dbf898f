"""A token cache on a full disk: the run failed blaming DST and left
`parsed/.tmp-*.arrow` behind, so every later run failed too. Now a write into the cache that fails
(ENOSPC, EDQUOT, any OSError) gives one warning naming the cache folder, removes its temporary
file, and the run goes on without the cache: exit 0 and the output --no-cache writes.

The disk is made full here as the kernel does it: the file is created, and its bytes go to
/dev/full, whose every write fails with ENOSPC."""

from __future__ import annotations

import builtins
import errno
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from etl.cache import folder as fo
from etl.cli import main
from tests.cache.common import chats, output_digests, write_jsonl

# Which file names each cache write path writes (a temporary name ends with its final name).
KINDS = {"marker": fo.MARKER, "key": fo.KEY_FILE, "answers": fo.ANSWERS_FILE, "runs": fo.RUNS_LOG,
         "segment": ".parquet", "parsed": fo.PARSED_SUFFIX}
WRITING = os.O_WRONLY | os.O_RDWR


def fill_disk(monkeypatch: pytest.MonkeyPatch, root: Path, full: Callable[[str], bool]) -> list[str]:
    """Writes below `root` to a file whose name `full` picks fail with ENOSPC; the names of every
    write below `root`, in order, are returned (a list that grows as the run writes)."""
    real_os_open, real_io_open = os.open, io.open
    writes: list[str] = []

    def below(path: object) -> str | None:
        if not isinstance(path, (str, bytes, os.PathLike)) or isinstance(path, int):
            return None
        name = os.fsdecode(path)
        return os.path.basename(name) if name.startswith(str(root) + os.sep) else None

    def os_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        fd = real_os_open(path, flags, mode, dir_fd=dir_fd)
        if (name := below(path)) is None or not flags & WRITING:
            return fd
        writes.append(name)
        if not full(name):
            return fd
        os.close(fd)
        return real_os_open("/dev/full", os.O_WRONLY)

    def io_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if (name := below(file)) is None or not set(mode) & set("wax+"):
            return real_io_open(file, mode, *args, **kwargs)
        writes.append(name)
        if not full(name):
            return real_io_open(file, mode, *args, **kwargs)
        real_io_open(file, mode, *args, **kwargs).close()
        return real_io_open("/dev/full", mode.replace("x", "w"), *args, **kwargs)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(io, "open", io_open)
    monkeypatch.setattr(builtins, "open", io_open)
    return writes


@pytest.fixture(scope="module")
def flags(tiny_tokenizer_path: Path) -> list[str]:
    return ["--tokenizer", str(tiny_tokenizer_path), "--template", "chatml", "--chunk-mb", "0.005"]


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory, flags: list[str]) -> Path:
    """60 chats (several chunks), and beside them `plain`: what --no-cache writes of them."""
    src = write_jsonl(tmp_path_factory.mktemp("full") / "src" / "chats.jsonl", chats(60)).parent
    assert main(["run", str(src), str(src.parent / "plain"), "--quiet", "--no-cache", *flags]) == 0
    return src


def warnings_of(err: str) -> list[str]:
    """Warning lines, less the one about the fixtures' `<|im_end|>` in content (on purpose, `chats`)."""
    return [line for line in err.splitlines() if "warning" in line and "spell a control token" not in line]


def temporary_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(fo.TMP_PREFIX)]


@pytest.mark.parametrize("kind", [*KINDS, "all"])
def test_a_full_cache_warns_once_and_the_run_goes_on_without_it(
        kind: str, src: Path, flags: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Each cache write path on a full disk: exit 0, one warning naming the cache, the output of
    --no-cache, no temporary file left, the failing write tried once (the cache is off from then
    on); the next run, with space again, fills the cache as usual."""
    cache, plain = tmp_path / "cache", output_digests(src.parent / "plain")
    capsys.readouterr()
    with monkeypatch.context() as m:
        writes = fill_disk(m, cache, lambda name: kind == "all" or name.endswith(KINDS[kind]))
        assert main(["run", str(src), str(tmp_path / "full"), "--quiet", "--cache", str(cache), *flags]) == 0
    err = capsys.readouterr().err
    (warning,) = warnings_of(err)
    assert f"token cache {cache} is full (no space left on device)" in warning, err
    assert "goes on without it" in warning and "--cache" in warning
    assert output_digests(tmp_path / "full") == plain
    assert temporary_files(cache) == []
    failed = [w for w in writes if kind == "all" or w.endswith(KINDS[kind])]
    assert len(failed) == 1, writes
    if kind == "parsed":  # the first chunk's write failed: no later chunk's and no segment was tried
        assert not any(w.endswith((".arrow", ".parquet")) for w in writes[writes.index(failed[0]) + 1:])

    assert main(["run", str(src), str(tmp_path / "again"), "--quiet", "--cache", str(cache), *flags]) == 0
    assert warnings_of(capsys.readouterr().err) == []
    assert output_digests(tmp_path / "again") == plain
    assert fo.segments(cache) and fo.parsed_files(cache) and fo.runs(cache) and temporary_files(cache) == []


def test_the_next_run_is_not_blocked(src: Path, flags: list[str], tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's sequence: the parsed chunk write fails; later runs on the still-full disk each
    warn and succeed (nothing stale is left to fill the disk further)."""
    cache = tmp_path / "cache"
    with monkeypatch.context() as m:
        fill_disk(m, cache, lambda name: name.endswith(fo.PARSED_SUFFIX))
        for i in range(2):
            assert main(["run", str(src), str(tmp_path / f"d{i}"), "--quiet", "--cache", str(cache), *flags]) == 0
            assert len(warnings_of(capsys.readouterr().err)) == 1
            assert temporary_files(cache) == [] and fo.parsed_files(cache) == []


def test_other_write_errors_and_quotas_name_the_cache_too(tmp_path: Path) -> None:
    """EDQUOT and a permission error: one line each, naming the cache and what to do."""
    from etl.cache.guard import CacheGuard, message

    root = tmp_path / "cache"
    quota = message(root, OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)))
    assert f"token cache {root} is over its disk quota" in quota and "\n" not in quota
    denied = message(root, PermissionError(errno.EACCES, "Permission denied", str(root / "parsed")))
    assert f"token cache {root} cannot be written (Permission denied: {root / 'parsed'})" in denied
    guard = CacheGuard()
    with pytest.warns(UserWarning, match="over its disk quota"):
        assert guard.attempt(root, lambda: (_ for _ in ()).throw(OSError(errno.EDQUOT, "quota"))) is None
    assert guard.off and guard.attempt(root, lambda: 1) is None  # off for the rest of the run
