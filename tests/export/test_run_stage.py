"""The export stage of `etl run`: the declarative schema's quick-start configs run unchanged and
write the Parquet output plus the bin/h5 token files into DST, which etl owns and a rerun removes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from etl import columns as c
from etl.cli import main
from etl.export.token_files import read_bin, read_meta
from etl.output.manifest import read_manifest

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "configs"
ASSETS = ROOT / "tests" / "assets" / "quick_start"
SEED = ROOT.parent / "shared" / "seeds" / "004_6d5e5b885b626ae7.txt"
QUICK_START = ("pipeline_sft_chat.json", "pipeline_instruction.json", "pipeline_pretraining.json")


def run(*argv: str | Path) -> int:
    return main(["run", *map(str, argv), "--quiet"])


def data_rows(out: Path, split: str = "train") -> list[dict[str, Any]]:
    return pq.read_table(out / c.DATA_DIR / split).to_pylist()


def folder_of(domain: str | None) -> str:
    return domain or c.DEFAULT_DOMAIN  # the export's name for "no domain"


def owned(out: Path) -> set[str]:
    """Every path the run's manifest and the export record list, and the records themselves."""
    records = [c.MANIFEST_FILE, c.EXPORT_FILE]
    return set(records) | {f["path"] for name in records for f in json.loads((out / name).read_text())["files"]}


def on_disk(out: Path) -> set[str]:
    return {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}


def test_quick_start_configs_are_the_seeds_verbatim() -> None:
    """examples/configs/pipeline_*.json are the quick start's JSON blocks, key for key."""
    if not SEED.is_file():
        pytest.skip("../shared is absent")
    text = "\n".join(line for line in SEED.read_text().splitlines() if line != "|")  # the page's row marks
    blocks = [json.loads(b) for b in re.findall(r"```json\n(.*?)\n```", text, re.DOTALL)]
    assert blocks == [json.loads((CONFIGS / name).read_text()) for name in QUICK_START]


@pytest.mark.parametrize(
    "config, fixture, counts, domains",
    [
        ("pipeline_sft_chat.json", "chat.jsonl",
         {"read": 5, "written": 4, "dropped": {"duplicate": 1}, "rejected": {}}, {"wiki", "code", c.DEFAULT_DOMAIN}),
        ("pipeline_instruction.json", "instruction.jsonl",
         {"read": 3, "written": 2, "dropped": {}, "rejected": {"missing_key": 1}}, {c.DEFAULT_DOMAIN}),
        ("pipeline_pretraining.json", "text.jsonl",
         {"read": 3, "written": 2, "dropped": {"too_short": 1}, "rejected": {}}, {c.DEFAULT_DOMAIN}),
    ],
)
def test_quick_start_config_writes_parquet_and_bin(tmp_path: Path, config: str, fixture: str,
                                                   counts: dict[str, Any], domains: set[str]) -> None:
    out = tmp_path / "out"
    assert run(ASSETS / fixture, out, "--config", CONFIGS / config) == 0
    manifest = read_manifest(out)
    assert {k: manifest["counts"][k] for k in counts} == counts
    rows = data_rows(out)
    assert len(rows) == counts["written"]
    assert {p.name for p in out.iterdir() if (p / "meta.json").is_file()} == domains
    for domain in domains:
        seq, mask, offsets = read_bin(out / domain)
        mine = [r for r in rows if folder_of(r["domain"]) == domain]
        assert seq.tolist() == [t for r in mine for t in r["input_ids"]]
        assert mask.tolist() == [int(m) for r in mine for m in r["loss_mask"]]
        assert np.diff(offsets).tolist() == [len(r["input_ids"]) for r in mine]
        assert read_meta(out / domain)["max_tokens_per_shard"] == 100_000_000
    assert on_disk(out) == owned(out)  # every file is etl's, listed by the run or its export stage


def test_pretraining_bin_holds_the_texts_bytes(tmp_path: Path) -> None:
    """The byte tokenizer, no template: sequence.bin is the kept texts' UTF-8, every token trained."""
    out = tmp_path / "out"
    assert run(ASSETS / "text.jsonl", out, "--config", CONFIGS / "pipeline_pretraining.json") == 0
    texts = [json.loads(line)["content"] for line in (ASSETS / "text.jsonl").read_text().splitlines()]
    kept = [t.encode() for t in texts if len(t) >= 50]
    seq, mask, offsets = read_bin(out / c.DEFAULT_DOMAIN)
    assert seq.tolist() == list(b"".join(kept)) and mask.tolist() == [1] * len(seq)
    assert offsets.tolist() == [0, len(kept[0]), len(kept[0]) + len(kept[1])]


def test_rerun_removes_exactly_the_token_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run(ASSETS / "chat.jsonl", out, "--config", CONFIGS / "pipeline_sft_chat.json") == 0
    (out / "wiki" / "notes.txt").write_text("mine")  # a user's file among etl's
    assert run(ASSETS / "chat.jsonl", out, "--config", CONFIGS / "pipeline_sft_chat.json") == 0
    assert (out / "wiki" / "notes.txt").read_text() == "mine"
    assert on_disk(out) == owned(out) | {"wiki/notes.txt"}
    assert run(ASSETS / "chat.jsonl", out) == 0  # Parquet only: the token files go, the user's stays
    assert not (out / c.EXPORT_FILE).exists() and not (out / "code").exists()
    assert on_disk(out) == {f["path"] for f in read_manifest(out)["files"]} | {c.MANIFEST_FILE, "wiki/notes.txt"}


def test_h5_val_split_and_shards(tmp_path: Path) -> None:
    h5py = pytest.importorskip("h5py")
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"split": {"val_fraction": 0.5}, "output": {
        "domain_key": "source", "storage_format": "h5", "max_tokens_per_shard": 40}}))
    out = tmp_path / "out"
    assert run(ASSETS / "chat.jsonl", out, "--config", cfg) == 0
    for split, folder in (("train", out), ("val", out / c.VAL_STORAGE_DIR)):
        rows = data_rows(out, split)
        for domain in {folder_of(r["domain"]) for r in rows}:
            meta = read_meta(folder / domain)
            assert meta["split"] == split
            ids = []
            for shard in meta["shards"]:
                with h5py.File(folder / domain / shard["files"]["data"]) as f:
                    ids += f["sequence"][:].tolist()
                    assert shard["num_tokens"] <= 40 or shard["num_sequences"] == 1  # never split
            mine = [r for r in rows if folder_of(r["domain"]) == domain]
            assert ids == [t for r in mine for t in r["input_ids"]]
            if all(r["num_tokens"] > 40 for r in mine):  # the fixture's chats (52-67 tokens): one shard each
                assert len(meta["shards"]) == len(mine)
    assert on_disk(out) == owned(out)


@pytest.mark.parametrize(
    "output, message",
    [
        ({"max_tokens_per_shard": 10}, ("output.max_tokens_per_shard sizes the bin/h5 token files; set "
         "output.storage_format")),
        ({"storage_format": "csv"}, "output.storage_format is 'csv'; allowed: bin, h5"),
        ({"storage_format": "bin", "max_tokens_per_shard": 0}, "output.max_tokens_per_shard must be a positive"),
        ({"domain_key": "source", "storage_format": "bin"}, ("output.domain_key is 'source' but input.domain_key "
         "is 'src'")),
    ],
)
def test_bad_output_sections_are_one_line(tmp_path: Path, output: dict[str, Any], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"input": {"type": "chat", "domain_key": "src"}, "output": output}))
    assert run(ASSETS / "chat.jsonl", tmp_path / "out", "--config", cfg) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_input_inside_dst_is_refused_with_token_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Domain folders go into DST, so SRC may not lie there (a domain named like it would mix)."""
    src = tmp_path / "out" / "raw" / "chat.jsonl"
    src.parent.mkdir(parents=True)
    src.write_text((ASSETS / "chat.jsonl").read_text())
    assert run(src.parent, tmp_path / "out", "--config", CONFIGS / "pipeline_sft_chat.json") == 2
    assert "where bin/h5 domain folders go" in capsys.readouterr().err


def test_storage_formats_are_the_backends() -> None:
    from typing import get_args

    from etl.config.file import StorageFormat
    from etl.export.backends import BACKENDS

    assert sorted(get_args(StorageFormat)) == sorted(BACKENDS)


def test_mixture_writes_token_files_per_source_domain(tmp_path: Path) -> None:
    """A mixture's output section: its sources' domains (their names) become the folders."""
    cfg = tmp_path / "mix.json"
    cfg.write_text(json.dumps({"sources": [{"path": str(ASSETS / "chat.jsonl"), "name": "chats"},
                                           {"path": str(ASSETS / "instruction.jsonl"), "name": "tasks",
                                            "input": {"type": "instruction", "prompt_key": "instruction",
                                                      "response_key": "output"}}],
                               "output": {"storage_format": "bin"}}))
    out = tmp_path / "out"
    assert main(["run", "--config", str(cfg), str(out), "--quiet"]) == 0
    rows = data_rows(out)
    assert {r["domain"] for r in rows} == {"chats", "tasks"}
    for domain in ("chats", "tasks"):
        assert read_bin(out / domain)[0].tolist() == [t for r in rows if r["domain"] == domain for t in r["input_ids"]]
    assert on_disk(out) == owned(out)
