"""Config files: the declarative pipeline schema runs unchanged, etl sections work, errors name the field."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from etl.cli import main
from etl.config.build import config_from_dict, train_roles
from etl.errors import EtlError
from etl.output.manifest import read_manifest

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "configs"


def write(path: Path, records: list[object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def chat(*turns: tuple[str, str]) -> dict[str, object]:
    return {"messages": [{"role": r, "content": c} for r, c in turns]}


def test_mask_rules_become_trained_roles() -> None:
    assert train_roles({"system": "mask", "user": "mask", "assistant": "train"}, "mask", "chat") == ("assistant",)
    assert train_roles({"prompt": "mask", "response": "train"}, "mask", "instruction") == ("assistant",)
    assert train_roles({"user": "mask"}, "train", "chat") == ("system", "assistant", "tool", "text")
    assert train_roles({}, "mask", "text") == ("text",)


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"inptu": {}}, "unknown key config.inptu"),
        ({"version": 2}, "version is 2; allowed: 1"),
        ({"mask": {"assistant": "learn"}}, "mask.assistant is 'learn'; allowed: mask, train"),
        ({"preprocessing": {"dedupe": True}}, "unknown key preprocessing.dedupe"),
        ({"input": {"type": "xml"}}, "input.type is 'xml'; allowed:"),
        ({"truncation": "middle"}, "truncation.policy is 'middle'; allowed: drop_oldest_turns"),
        ({"mask_options": {"eot": "sometimes"}}, "mask_options.eot is 'sometimes'; allowed: turn, last, all, none"),
        ({"output": {"storage_format": "parquet"}}, "output.storage_format is 'parquet'; allowed: bin, h5"),
        ({"output": {"max_tokens_per_shard": 10}}, "output.max_tokens_per_shard sizes the bin/h5 token files"),
        ({"output": {"shards": 2}}, "unknown key output.shards; allowed: domain_key, max_tokens_per_shard"),
        ({"input": {"domain_key": "a"}, "output": {"domain_key": "b"}}, "output.domain_key is 'b' but input.domain_key"),
        ({"split": {"val_fraction": 1.5}}, "split.val_fraction must be in [0, 1)"),
        ({"preprocessing": {"deduplicate": "false"}}, "preprocessing.deduplicate must be true or false, got 'false'"),
        ({"mask_options": {"last_assistant_only": "no"}}, "mask_options.last_assistant_only must be true or false"),
        ({"seq_len": 100.5}, "seq_len must be an integer, got 100.5"),
        ({"seq_len": "2048"}, "seq_len must be an integer, got '2048'"),
        ({"preprocessing": {"max_items": True}}, "preprocessing.max_items must be an integer or null"),
        ({"split": {"val_fraction": "0.1"}}, "split.val_fraction must be a number"),
        ({"input": "chat"}, "input must be an object, got 'chat'"),
        ({"mask_default": "bogus"}, "mask.mask_default is 'bogus'; allowed: mask, train"),
    ],
)
def test_bad_configs_name_the_field(tmp_path: Path, doc: dict[str, object], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(doc))
    src = write(tmp_path / "raw.jsonl", [chat(("user", "a"), ("assistant", "b"))])
    assert main(["run", str(src), str(tmp_path / "out"), "--config", str(cfg), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_flags_override_the_file(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"seq_len": 64, "template": "chatml"}))
    src = write(tmp_path / "raw.jsonl", [chat(("user", "a"), ("assistant", "b"))])
    assert main(["run", str(src), str(tmp_path / "out"), "--config", str(cfg), "--seq-len", "32", "--quiet"]) == 0
    manifest = read_manifest(tmp_path / "out")
    assert manifest["seq_len"] == 32 and manifest["template"]["name"] == "chatml"


def test_an_unknown_input_type_flag_is_told_as_the_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write(tmp_path / "raw.jsonl", [chat(("user", "a"), ("assistant", "b"))])
    assert main(["run", str(src), str(tmp_path / "out"), "--input-type", "xml"]) == 2  # was an internal error
    assert "config: input.type is 'xml'; allowed: chat, instruction," in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_toml_config_with_dedup_and_split(tmp_path: Path) -> None:
    records = [chat(("user", f"q{i}"), ("assistant", f"a{i}")) for i in range(200)]
    src = write(tmp_path / "raw.jsonl", records + records[:10])  # 10 exact duplicates
    out = tmp_path / "out"
    assert main(["run", str(src), str(out), "--config", str(CONFIGS / "sft.toml"), "--tokenizer", "bytes", "--quiet"]) == 0
    counts = read_manifest(out)["counts"]
    assert counts["read"] == 210 and counts["dropped"] == {"duplicate": 10} and counts["written"] == 200
    train = pq.read_table(out / "data" / "train").num_rows
    val = pq.read_table(out / "data" / "val").num_rows
    assert train + val == 200 and 5 <= val <= 40  # ~10% by an MD5 draw per id
    # The split is a function of the id: a second run puts every id in the same split.
    again = tmp_path / "again"
    assert main(["run", str(src), str(again), "--config", str(CONFIGS / "sft.toml"), "--quiet"]) == 0
    assert pq.read_table(again / "data" / "val").column("id") == pq.read_table(out / "data" / "val").column("id")


def test_prefix_dedup_is_the_first_200_chars(tmp_path: Path) -> None:
    head = "x" * 300
    src = write(tmp_path / "raw.jsonl", [chat(("user", head + "1"), ("assistant", "a")), chat(("user", head + "2"), ("assistant", "a"))])
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"preprocessing": {"deduplicate": True}}))
    assert main(["run", str(src), str(tmp_path / "p"), "--config", str(cfg), "--quiet"]) == 0
    assert read_manifest(tmp_path / "p")["counts"]["dropped"] == {"duplicate": 1}
    cfg.write_text(json.dumps({"preprocessing": {"deduplicate": True, "dedup_mode": "exact"}}))
    assert main(["run", str(src), str(tmp_path / "e"), "--config", str(cfg), "--quiet"]) == 0
    assert read_manifest(tmp_path / "e")["counts"]["written"] == 2


def test_max_items_stops_reading(tmp_path: Path) -> None:
    src = write(tmp_path / "raw.jsonl", [chat(("user", "a"), ("assistant", str(i))) for i in range(50)])
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"preprocessing": {"max_items": 7}}))
    assert main(["run", str(src), str(tmp_path / "out"), "--config", str(cfg), "--quiet", "--chunk-mb", "0.0005"]) == 0
    assert read_manifest(tmp_path / "out")["counts"]["read"] == 7


def test_config_keys_reach_the_run() -> None:
    kwargs = config_from_dict(json.loads((CONFIGS / "pipeline_sft_chat.json").read_text()))
    assert kwargs["seq_len"] == 2048 and kwargs["deduplicate"] is True
    assert kwargs["input_options"]["domain_key"] == "source"  # output.domain_key: the input's option
    assert kwargs["storage_format"] == "bin" and kwargs["max_tokens_per_shard"] == 100_000_000
    with pytest.raises(EtlError, match="applies to input.type text only"):
        config_from_dict({"preprocessing": {"min_chars": 5}})


@pytest.mark.parametrize(
    "config, records, written",
    [
        ("pipeline_sft_chat.json", [chat(("user", "q"), ("assistant", "a")) | {"source": "wiki"},
                                   chat(("user", "q2"), ("assistant", "a2")) | {"source": "code"}], 2),
        ("pipeline_instruction.json", [{"instruction": "Say hi.", "output": "hi"}], 1),
        ("pipeline_pretraining.json", [{"content": "x" * 60}, {"content": "too short"}], 1),
    ],
)
def test_declarative_quick_start_configs_run_unchanged(tmp_path: Path, config: str, records: list[dict[str, object]], written: int) -> None:
    from etl.export.token_files import read_bin

    src = write(tmp_path / "raw.jsonl", records)
    out = tmp_path / "out"
    assert main(["run", str(src), str(out), "--config", str(CONFIGS / config), "--quiet"]) == 0  # and the bin files
    manifest = read_manifest(out)
    assert manifest["counts"]["written"] == written
    data = pq.read_table(out / "data" / "train").to_pylist()
    for domain in {row["domain"] for row in data}:
        seq, mask, offsets = read_bin(out / domain)
        rows = [row for row in data if row["domain"] == domain]
        assert seq.tolist() == [t for row in rows for t in row["input_ids"]]
        assert mask.tolist() == [int(m) for row in rows for m in row["loss_mask"]]
        assert len(offsets) == len(rows) + 1


def test_pretraining_trains_every_token_without_a_template(tmp_path: Path) -> None:
    src = write(tmp_path / "raw.jsonl", [{"content": "y" * 60}])
    out = tmp_path / "out"
    assert main(["run", str(src), str(out), "--config", str(CONFIGS / "pipeline_pretraining.json"), "--quiet"]) == 0
    row = pq.read_table(out / "data" / "train").to_pylist()[0]
    assert row["input_ids"] == [ord("y")] * 60 and all(row["loss_mask"])
    assert read_manifest(out)["counts"]["dropped"] == {}


def test_text_input_keeps_the_first_tokens(tmp_path: Path) -> None:
    src = write(tmp_path / "raw.jsonl", [{"content": "A" * 10 + "B" * 100 + "Z" * 10}])
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"input": {"type": "text", "text_key": "content"}, "preprocessing": {"max_seq_len": 40}}))
    assert main(["run", str(src), str(tmp_path / "out"), "--config", str(cfg), "--quiet"]) == 0
    row = pq.read_table(tmp_path / "out" / "data" / "train").to_pylist()[0]
    assert bytes(row["input_ids"]) == b"A" * 10 + b"B" * 30  # the first max_seq_len


def test_mask_default_train_without_mask_trains_every_role(tmp_path: Path) -> None:
    src = write(tmp_path / "raw.jsonl", [chat(("user", "q"), ("assistant", "a"))])
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"mask_default": "train", "default_system": None}))
    assert main(["run", str(src), str(tmp_path / "out"), "--config", str(cfg), "--quiet"]) == 0
    row = pq.read_table(tmp_path / "out" / "data" / "train").to_pylist()[0]
    assert row["loss_mask"] == [False, True, True, False, True, True]  # user q E, assistant a E
