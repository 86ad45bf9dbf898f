"""Issue 26: every reader of the pack index checks it with the one function (case 8), its parts carry
the `etl pack`'s identity and the data run's (case 7), `_packs.json` is the one record of it, and
stream packing records the tokens it skips."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from etl import columns as c
from etl.cli import main
from etl.errors import EtlError
from etl.output.manifest import read_manifest
from etl.output.parquet import DATA_RUN_ID_KEY, RUN_ID_KEY, part_identity
from etl.packing.index_io import read_pack_index
from etl.packing.stream import stream
from tests.helpers import write_manifest
from tests.packing.test_index import make_dst
from tests.packing.test_stream import build

PART = "packs/train/part-00000.parquet"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dst(tmp_path_factory.mktemp("pack_record"), n=40)


@pytest.fixture
def dst(built: Path, tmp_path: Path) -> Path:
    shutil.copytree(built.parent, tmp_path, dirs_exist_ok=True)
    return tmp_path / built.name


def pack(dst: Path, *args: str) -> None:
    assert main(["pack", str(dst), "--strategy", "bfd", "--seq-len", "128", *args]) == 0


def _stats(dst: Path) -> object:
    from etl.analysis.stats import run_query

    return run_query(dst, "packs").to_pylist()


def _loader(dst: Path) -> object:
    return read_pack_index(dst, "train", ids=False)


def _inspect(dst: Path) -> object:
    from etl.analysis.inspect_pack import read_pack

    return read_pack(dst, split="train", pack=0)


READERS: dict[str, Callable[[Path], object]] = {"stats": _stats, "loader": _loader, "inspect": _inspect}


def flip(path: Path, at: int) -> None:
    body = bytearray(path.read_bytes())
    body[at] ^= 0x04
    path.write_bytes(bytes(body))


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_refuses_a_flipped_bit_in_the_pack_index(reader: str, dst: Path) -> None:
    """Case 8: `etl stats --query packs` read a flipped bit as 499 examples instead of 500, while
    the loader and inspect refused it; each of them now refuses it in the same words."""
    pack(dst)
    clean = dst.parent / "clean"
    shutil.copytree(dst, clean)
    group = pq.read_metadata(dst / PART).row_group(0)
    chunks = [group.column(i) for i in range(group.num_columns)]
    chunk = next(k for k in chunks if k.path_in_schema.startswith(c.PIECE_ROWS))
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    for step in range(8):  # bits across the `rows` pages: each a same-size part, other content
        at = start + (step + 1) * chunk.total_compressed_size // 9
        flip(dst / PART, at)
        with pytest.raises(EtlError) as caught:
            READERS[reader](dst)
        message = str(caught.value)
        assert str(dst / PART) in message and "rerun `etl pack`" in message and "\n" not in message
        shutil.copyfile(clean / PART, dst / PART)
    READERS[reader](dst)  # the undamaged index reads


def test_pack_parts_carry_the_packs_identity_and_the_data_runs(dst: Path) -> None:
    pack(dst)
    record = json.loads((dst / c.PACKS_FILE).read_text())
    run_id = read_manifest(dst)[c.RUN_ID]
    assert record[c.DATA_RUN_ID] == run_id and len(record[c.RUN_ID]) == 16 and record[c.RUN_ID] != run_id
    for entry in record["files"]:
        meta = pq.read_metadata(dst / entry["path"])
        assert part_identity(meta) == {RUN_ID_KEY: record[c.RUN_ID], DATA_RUN_ID_KEY: run_id}
    again = dst.parent / "again"
    shutil.copytree(dst, again)
    pack(again)  # the same pack of the same data: the same identity, the same bytes
    for entry in record["files"]:
        assert (again / entry["path"]).read_bytes() == (dst / entry["path"]).read_bytes()


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_pack_part_of_another_pack_is_refused(reader: str, dst: Path) -> None:
    """Case 7 for the pack index: bfd ignores its seed, so `--seed 1` writes the same packs under
    another identity (same size, same rows); put in place of the seed-0 part, it is refused."""
    other = dst.parent / "other"
    shutil.copytree(dst, other)
    pack(dst)
    pack(other, "--seed", "1")
    assert (dst / PART).stat().st_size == (other / PART).stat().st_size
    shutil.copyfile(other / PART, dst / PART)
    with pytest.raises(EtlError, match=r"another etl run .*rerun `etl pack`"):
        READERS[reader](dst)


def test_packs_json_is_the_record_and_the_manifest_holds_a_copy_written_after_it(dst: Path) -> None:
    """A crash between `_packs.json` and the manifest's `packs` key left them disagreeing: now the
    copy is removed first and written after the record, and every reader reads the record."""
    pack(dst)
    record = json.loads((dst / c.PACKS_FILE).read_text())
    assert read_manifest(dst)[c.MANIFEST_PACKS] == record["splits"]
    rows = {r["split"]: r for r in _stats(dst)}  # type: ignore[attr-defined]
    assert {s: rows[s]["packs"] for s in rows} == {s: v["num_packs"] for s, v in record["splits"].items()}


def test_a_crash_before_the_copy_leaves_it_absent_and_a_stale_copy_is_never_read(
    dst: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from etl.output.writer import OutputWriter

    pack(dst)
    amend = OutputWriter.amend

    def crash_on_the_copy(self: OutputWriter, kind: str, key: str, value: object) -> None:
        if value is not None:
            raise KeyboardInterrupt  # killed between the record and the copy
        amend(self, kind, key, value)

    monkeypatch.setattr(OutputWriter, "amend", crash_on_the_copy)
    assert main(["pack", str(dst), "--strategy", "ffd", "--seq-len", "128"]) == 130
    monkeypatch.undo()
    assert c.MANIFEST_PACKS not in read_manifest(dst)  # absent, not the previous index's summary
    manifest = read_manifest(dst)
    manifest[c.MANIFEST_PACKS] = {"train": {"strategy": "ffd", "num_packs": 1}}  # a stale copy
    write_manifest(dst, manifest)  # sealed, as etl's amend would
    record = json.loads((dst / c.PACKS_FILE).read_text())  # the interrupted ffd pack's, committed
    assert record["splits"]["train"]["strategy"] == "ffd" and record["splits"]["train"]["num_packs"] > 1
    rows = {r["split"]: r for r in _stats(dst)}  # type: ignore[attr-defined]
    assert rows["train"]["packs"] == record["splits"]["train"]["num_packs"]
    index = read_pack_index(dst, "train")
    assert index is not None and index.strategy == "ffd" and index.packing.num_packs > 1
    pack(dst)
    assert read_manifest(dst)[c.MANIFEST_PACKS]["train"]["strategy"] == "bfd"


# One conversation of 18 tokens: system (5: marker, 3 tokens, end), user (8: marker, 6, end),
# assistant (4), EOS. At S = 8 block 0 holds tokens 0..7; block 1 starts inside the user span, so
# it gets the system span (5) and the user header (1) injected and room for 2 more (8, 9); it ends
# before the user does, so the rest of the document (10..17, 8 tokens) is skipped.
CONV = [("system", [1, 2, 3]), ("user", [4, 5, 6, 7, 8, 9]), ("assistant", [10, 11])]


def test_stream_skipped_tokens_are_counted_by_hand() -> None:
    from etl.packing.pieces import held_tokens

    docs, _, turns = build([CONV])
    lengths = np.array([len(d) for d in docs])
    assert lengths.tolist() == [18]
    packing = stream(lengths, seq_len=8, turns=turns)
    assert packing.num_packs == 2 and int(packing.length.sum()) == 16 and packing.utilization(8) == 1.0
    assert held_tokens(packing, lengths) == 10  # tokens 0..9, the injected repeats counted once


def test_stream_at_a_small_s_records_its_skipped_tokens(dst: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """At S = 24 a third of the tokens are skipped: the record, the stats query and the command's
    line say how much, where `clipped 0` and utilization 1.0 said nothing was lost."""
    from etl.packing.index import build_pack_index
    from etl.packing.pieces import held_tokens

    assert main(["pack", str(dst), "--strategy", "stream", "--seq-len", "24", "--split", "train"]) == 0
    err = capsys.readouterr().err
    summary = json.loads((dst / c.PACKS_FILE).read_text())["splits"]["train"]
    index = build_pack_index(dst, "train", strategy="stream", seq_len=24)
    data = pq.read_table(dst / "data" / "train", columns=[c.NUM_TOKENS])
    total = int(data.column(c.NUM_TOKENS).to_numpy().sum())
    held = held_tokens(index.packing, data.column(c.NUM_TOKENS).to_numpy())
    assert summary["clipped"] == 0 and summary["example_tokens"] == total
    assert summary["skipped_tokens"] == total - held and summary["skipped_tokens"] > total // 4
    assert summary["stream_utilization"] == pytest.approx(held / total)
    assert summary["stream_utilization"] < 0.9 < summary["utilization"]
    assert f"train: skipped {summary['skipped_tokens']:,} of {total:,} tokens" in err  # one warning line
    row = _stats(dst)[0]  # type: ignore[index]
    assert row["skipped_tokens"] == summary["skipped_tokens"]
    assert row["stream_utilization"] == round(summary["stream_utilization"], 6)


def test_whole_example_packers_count_clipped_tokens_as_skipped(dst: Path) -> None:
    from etl.packing.index import build_pack_index

    n = pq.read_table(dst / "data" / "train", columns=[c.NUM_TOKENS]).column(c.NUM_TOKENS).to_numpy()
    for strategy, skipped in (("bfd", int(np.maximum(n - 128, 0).sum())), ("sequential", 0)):
        summary = build_pack_index(dst, "train", strategy=strategy, seq_len=128).summary()
        assert summary["skipped_tokens"] == skipped and summary["example_tokens"] == int(n.sum())
