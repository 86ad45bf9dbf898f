"""Issue 37 item 3: a damaged output is never read. Each test performs an attack on a finished
output (a bit flipped in the manifest, a manifest edited and re-checksummed against its parts, a
part truncated or taken from another run over same-named, same-size inputs) and asserts that every
reader that trains, packs or reports refuses it with one line naming the file and the fix."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from etl import columns as c
from etl.cli import main
from etl.errors import EtlError, EtlWarning
from etl.output.manifest import read_manifest
from tests.commands.test_run_cli import write_jsonl
from tests.helpers import write_manifest

PART = "data/train/part-00001.parquet"
S = 512


def chats(changed: int | None = None) -> list[dict[str, Any]]:
    """600 chats of 60-500 tokens (byte tokenizer); `changed`: that record's answer has one letter
    replaced, so the file keeps its name and size and its two ends (the run identity's sample)."""
    rng = random.Random(7)
    out = []
    for i in range(600):
        answer = "".join(rng.choice("abcdefgh ") for _ in range(rng.randrange(20, 380)))
        if i == changed:
            answer = answer.replace("a", "b", 1)
        question = f"question {i} " + "q" * rng.randrange(10, 100)
        out.append({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]})
    return out


def run(raw: Path, dst: Path) -> Path:
    assert main(["run", str(raw), str(dst), "--quiet", "--seq-len", str(S), "--chunk-mb", "0.05"]) == 0
    return dst


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Run a, and run b over a same-named, same-size input that differs in the middle: the two
    share a run identity, and b's PART has a's size and rows but other rows (the issue's attack)."""
    root = tmp_path_factory.mktemp("verify")
    a = run(write_jsonl(root / "in-a" / "chats.jsonl", chats()), root / "a")
    for changed in range(300, 320):  # the first one whose part compresses to the same size
        raw = write_jsonl(root / f"in-{changed}" / "chats.jsonl", chats(changed))
        b = run(raw, root / f"b-{changed}")
        if (b / PART).stat().st_size == (a / PART).stat().st_size and (b / PART).read_bytes() != (a / PART).read_bytes():
            return a, b
    raise AssertionError("no same-size foreign part found")


@pytest.fixture
def dst(runs: tuple[Path, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(runs[0], tmp_path / "out"))


def _loader(dst: Path, tmp: Path) -> list[str]:
    from etl.loader import ParquetLoader

    next(iter(ParquetLoader(dst, batch_size=4)))
    return []


CLI: dict[str, Callable[[Path, Path], list[str]]] = {
    "stats": lambda dst, tmp: ["stats", str(dst)],
    "pack": lambda dst, tmp: ["pack", str(dst), "--strategy", "bfd"],
    "inspect": lambda dst, tmp: ["inspect", str(dst), "--row", "0", "--plain"],
    "export": lambda dst, tmp: ["export", str(dst), str(tmp / "episodes"), "--format", "episodes"],
}


def refused(reader: str, dst: Path, tmp: Path, capsys: pytest.CaptureFixture[str], *, fix: bool = True) -> str:
    """The one line `reader` refuses `dst` with (the loader: its EtlError's message)."""
    if reader == "loader":
        with pytest.raises(EtlError) as caught:
            _loader(dst, tmp)
        message = str(caught.value)
    else:
        capsys.readouterr()
        assert main(CLI[reader](dst, tmp)) == 2
        message = capsys.readouterr().err.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in message, message
    assert not fix or "rerun `etl run`" in message, message
    return message


READERS = ["loader", *CLI]


def flip(dst: Path, text: str, bit: int = 0, at: int = -1) -> None:
    """Flip one bit of the manifest's bytes: bit `bit` of character `at` of the first `text`."""
    body = bytearray((dst / c.MANIFEST_FILE).read_bytes())
    where = body.index(text.encode()) + (at % len(text))
    body[where] ^= 1 << bit
    (dst / c.MANIFEST_FILE).write_bytes(bytes(body))


@pytest.mark.parametrize("reader", READERS)
def test_the_issue_seq_len_512_flipped_to_112_is_refused(reader: str, dst: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    flip(dst, f'"seq_len": {S}', bit=2, at=-3)  # '5' (0x35) -> '1' (0x31)
    assert '"seq_len": 112' in (dst / c.MANIFEST_FILE).read_text()
    message = refused(reader, dst, tmp_path, capsys)
    assert c.MANIFEST_FILE in message and "fails its checksum" in message


# One bit of another field: (text to find, bit, character), each still valid JSON.
FLIPS = {
    "pad_id": ('"pad_id": 259', 0, -1),
    "eot_id": ('"eot_id": 259', 0, -1),
    "kind": ('"kind": "sft"', 0, -2),
    "format_version": ('"format_version": 3', 0, -1),
    "written": ('"written": 600', 1, -1),
    "vocab_size": ('"vocab_size": 260', 2, -1),
    "a part's bytes": ('"bytes": ', 0, -1),
    "a part's sha256": ('"sha256": "', 0, -1),
    "run_id": ('"run_id": "', 0, -1),
    "the checksum's key": ('"record_sha256"', 0, -2),
    "the checksum": ('"record_sha256": "', 0, -1),
}


@pytest.mark.parametrize("field", sorted(FLIPS))
def test_a_flipped_bit_of_any_field_is_refused(field: str, dst: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    text, bit, at = FLIPS[field]
    if field == "a part's bytes":  # its last digit
        text = text + str(read_manifest(dst)["files"][0]["bytes"])
    elif field in ("a part's sha256", "run_id", "the checksum"):
        body = (dst / c.MANIFEST_FILE).read_text()
        text = text + body[body.index(text) + len(text)]
    flip(dst, text, bit, at)
    message = refused("loader", dst, tmp_path, capsys)
    assert c.MANIFEST_FILE in message and "checksum" in message
    assert "checksum" in refused("stats", dst, tmp_path, capsys)


def test_random_bit_flips_never_pass_as_another_manifest(dst: Path) -> None:
    """400 random one-bit flips anywhere in the file: each is refused in one line, or leaves the
    same content (a flip in a hex escape's case, say)."""
    good, body = read_manifest(dst), (dst / c.MANIFEST_FILE).read_bytes()
    rng = random.Random(37)
    for _ in range(400):
        pos, bit = rng.randrange(len(body)), rng.randrange(8)
        damaged = bytearray(body)
        damaged[pos] ^= 1 << bit
        (dst / c.MANIFEST_FILE).write_bytes(bytes(damaged))
        try:
            assert read_manifest(dst) == good, (pos, bit)
        except EtlError as exc:
            assert "\n" not in str(exc) and c.MANIFEST_FILE in str(exc)


# Edits re-checksummed by hand (or by a tool that rewrote the manifest) that the parts or the
# template contradict: (edit, what the refusal says).
RESEALED: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "seq_len below the longest row": (lambda m: m.update(seq_len=112), "holds a row of"),
    "eot_id": (lambda m: m.update(eot_id=258, pad_id=258), "end-of-turn id of its template"),
    "pad_id": (lambda m: m.update(pad_id=0), "pad_id 0 is not its eot_id"),
    "kind": (lambda m: m.update(kind="preference"), "lacks prompt_ids"),
    "vocab_size": (lambda m: m["tokenizer"].update(vocab_size=200), "vocabulary of 200"),
    "eos_ids": (lambda m: m.update(eos_ids=[259]), "eos_ids [259] differ"),
    "seq_len not a length": (lambda m: m.update(seq_len=1), "seq_len 1 must be at least 2"),
}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("edit", sorted(RESEALED))
def test_a_resealed_manifest_that_contradicts_its_parts_is_refused(edit: str, reader: str, dst: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    change, says = RESEALED[edit]
    manifest = read_manifest(dst)
    change(manifest)
    write_manifest(dst, manifest)
    if (edit, reader) == ("kind", "export"):  # export takes no pairs: refused before any part is read
        assert "holds preference pairs" in refused(reader, dst, tmp_path, capsys, fix=False)
        return
    message = refused(reader, dst, tmp_path, capsys)
    assert says in message and c.MANIFEST_FILE in message, message


def test_a_larger_resealed_seq_len_is_consistent_and_read(dst: Path, tmp_path: Path) -> None:
    """S above every row is what a run with a larger --seq-len writes: nothing to refuse."""
    manifest = read_manifest(dst)
    manifest["seq_len"] = 1024
    write_manifest(dst, manifest)
    _loader(dst, tmp_path)


def test_a_manifest_without_its_checksum(dst: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Format 3 must carry it; a format 2 manifest (an etl before checksums) reads with a warning."""
    manifest = read_manifest(dst)
    del manifest[c.RECORD_SHA256]
    (dst / c.MANIFEST_FILE).write_text(json.dumps(manifest), encoding="utf-8")
    assert "lacks its checksum" in refused("loader", dst, tmp_path, capsys)
    manifest["format_version"] = 2
    (dst / c.MANIFEST_FILE).write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.warns(EtlWarning, match="has no checksum"):
        _loader(dst, tmp_path)
    manifest["seq_len"] = 112  # its facts are still checked
    (dst / c.MANIFEST_FILE).write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.warns(EtlWarning), pytest.raises(EtlError, match="holds a row of"):
        _loader(dst, tmp_path)


def test_a_manifest_that_is_not_json_is_refused(dst: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest, body = read_manifest(dst), (dst / c.MANIFEST_FILE).read_bytes()
    (dst / c.MANIFEST_FILE).write_bytes(body[: len(body) // 2])  # torn
    assert "is unreadable" in refused("loader", dst, tmp_path, capsys)
    assert "is unreadable" in refused("stats", dst, tmp_path, capsys)
    (dst / c.MANIFEST_FILE).write_text("[1, 2]", encoding="utf-8")
    assert "not a JSON object" in refused("pack", dst, tmp_path, capsys)
    (dst / c.MANIFEST_FILE).write_text(json.dumps({**manifest, "seq_len": float("nan")}), encoding="utf-8")
    assert "fails its checksum" in refused("loader", dst, tmp_path, capsys)


@pytest.mark.parametrize("reader", READERS)
def test_a_part_of_a_run_over_same_named_same_size_inputs_is_refused(reader: str, runs: tuple[Path, Path], dst: Path,
                                                                     tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's second attack: same run identity, same size and rows; only the sha256 differs."""
    a, b = runs
    assert read_manifest(a)[c.RUN_ID] == read_manifest(b)[c.RUN_ID]
    shutil.copyfile(b / PART, dst / PART)
    message = refused(reader, dst, tmp_path, capsys)
    assert PART in message and "does not match its sha256" in message


def test_inputs_differing_near_an_end_get_another_run_identity(runs: tuple[Path, Path], tmp_path: Path) -> None:
    """The run identity samples each input's two ends: a same-named, same-size input that differs
    there stamps other parts, refused by the footer identity before any sha256 is read."""
    b = run(write_jsonl(tmp_path / "in" / "chats.jsonl", chats(changed=2)), tmp_path / "b")
    assert read_manifest(b)[c.RUN_ID] != read_manifest(runs[0])[c.RUN_ID]


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("how", ["cut", "cut and padded back to its size"])
def test_a_truncated_part_is_refused(how: str, reader: str, dst: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    body = (dst / PART).read_bytes()
    cut = body[: len(body) - 4096]
    (dst / PART).write_bytes(cut if how == "cut" else cut + bytes(4096))
    message = refused(reader, dst, tmp_path, capsys)
    assert PART in message


def test_a_part_of_another_split_or_position_is_refused(dst: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Two parts of the same run swapped: same identity; sizes, rows or sha256 tell them apart."""
    other = dst / "data" / "train" / "part-00002.parquet"
    first, second = (dst / PART).read_bytes(), other.read_bytes()
    (dst / PART).write_bytes(second)
    other.write_bytes(first)
    assert "part-0000" in refused("loader", dst, tmp_path, capsys)
    assert "part-0000" in refused("pack", dst, tmp_path, capsys)


def test_etl_pack_reseals_the_manifest_it_amends(dst: Path) -> None:
    assert main(["pack", str(dst), "--strategy", "bfd"]) == 0
    manifest = read_manifest(dst)  # verified: the amended copy carries a fresh checksum
    assert c.MANIFEST_PACKS in manifest and c.RECORD_SHA256 in manifest
    assert c.RECORD_SHA256 in json.loads((dst / c.PACKS_FILE).read_text())


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("pairs") / "out"
    examples = Path(__file__).resolve().parents[2] / "examples" / "pairs"
    assert main(["run", str(examples), str(dst), "--input-type", "preference", "--quiet"]) == 0
    return dst


def test_the_pair_loader_refuses_a_damaged_preference_output(pairs: Path, tmp_path: Path) -> None:
    """S of a pair is prompt + max(chosen, rejected) (fit separate): read from its length columns."""
    from etl.loader import ParquetLoader

    dst = Path(shutil.copytree(pairs, tmp_path / "flipped"))
    flip(dst, '"seq_len": 2048', bit=0, at=-1)  # 2048 -> 2049
    with pytest.raises(EtlError, match="fails its checksum"):
        ParquetLoader(dst, batch_size=2)
    dst = Path(shutil.copytree(pairs, tmp_path / "resealed"))
    manifest = read_manifest(dst)
    table = pq.read_table(dst / c.DATA_DIR, columns=[c.NUM_PROMPT_TOKENS, c.NUM_CHOSEN_TOKENS, c.NUM_REJECTED_TOKENS])
    prompt, chosen, rejected = (np.asarray(col) for col in table.columns)
    longest = int((prompt + np.maximum(chosen, rejected)).max())  # < prompt + chosen + rejected
    assert longest < int((prompt + chosen + rejected).max())
    write_manifest(dst, {**manifest, "seq_len": longest})
    next(iter(ParquetLoader(dst, batch_size=2)))  # exactly S: what a run at S=134 could write
    write_manifest(dst, {**manifest, "seq_len": longest - 1})
    with pytest.raises(EtlError, match=f"holds a row of {longest} tokens"):
        ParquetLoader(dst, batch_size=2)
    write_manifest(dst, {**manifest, "kind": "sft"})
    with pytest.raises(EtlError, match="lacks input_ids, loss_mask"):
        ParquetLoader(dst, batch_size=2)


def test_a_flipped_pack_record_is_refused(dst: Path, tmp_path: Path) -> None:
    """`_packs.json` is verified as the manifest is: its seq_len flipped, the loader refuses it."""
    from etl.loader import PackOptions, ParquetLoader

    assert main(["pack", str(dst), "--strategy", "bfd"]) == 0
    next(iter(ParquetLoader(dst, batch_size=2, packing=PackOptions("bfd"))))
    body = (dst / c.PACKS_FILE).read_text()
    (dst / c.PACKS_FILE).write_text(body.replace(f'"seq_len": {S}', '"seq_len": 112', 1), encoding="utf-8")
    with pytest.raises(EtlError, match=r"_packs.json fails its checksum.*rerun `etl pack`"):
        ParquetLoader(dst, batch_size=2, packing=PackOptions("bfd"))
