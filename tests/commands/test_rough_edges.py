"""Rough edges a new user hit (issue 8): each test runs the command the way that user did."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY_CONFIG = REPO / "tests" / "assets" / "tiny_chat" / "tokenizer_config.json"
TINY_SPECIALS = ["<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT = {"messages": [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello"}]}


def etl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m etl ARGS` in `cwd`, importing this checkout's etl (what a user's shell does)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "etl", *args], capture_output=True, text=True, cwd=cwd, env=env, check=False
    )


def write_tiny_tokenizer(folder: Path, *, extra: tuple[str, ...] = ()) -> Path:
    """A byte-level BPE model directory for template `hf`; `extra` specials change its sha256."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder.mkdir(parents=True)
    shutil.copy(TINY_CONFIG, folder)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([*TINY_SPECIALS, *extra])
    tok.save(str(folder / "tokenizer.json"))
    return folder


def test_inspect_finds_the_tokenizer_from_another_folder(tmp_path: Path) -> None:
    start, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    write_tiny_tokenizer(start / "tok")
    elsewhere.mkdir()
    (start / "raw.jsonl").write_text(json.dumps(CHAT) + "\n")
    run = etl("run", "raw.jsonl", "out", "--tokenizer", "tok", "--template", "hf", "--quiet", cwd=start)
    assert run.returncode == 0, run.stderr
    recorded = json.loads((start / "out" / "_manifest.json").read_text())["tokenizer"]
    assert Path(recorded["path"]).is_absolute()

    shown = etl("inspect", str(start / "out"), "--row", "0", "--plain", cwd=elsewhere)
    assert shown.returncode == 0, shown.stderr
    assert "[[hello<|end|>]]" in shown.stdout


def test_inspect_checks_the_tokenizer_sha256_and_takes_tokenizer(tmp_path: Path) -> None:
    write_tiny_tokenizer(tmp_path / "tok")
    other = write_tiny_tokenizer(tmp_path / "other", extra=("<|extra|>",))
    (tmp_path / "raw.jsonl").write_text(json.dumps(CHAT) + "\n")
    run = etl("run", "raw.jsonl", "out", "--tokenizer", "tok", "--template", "hf", "--quiet", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    (tmp_path / "tok").rename(tmp_path / "moved")  # the manifest's path no longer loads

    missing = etl("inspect", "out", "--row", "0", cwd=tmp_path)
    assert missing.returncode == 2 and "--tokenizer PATH" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1

    wrong = etl("inspect", "out", "--row", "0", "--tokenizer", str(other), cwd=tmp_path)
    sha_run = json.loads((tmp_path / "out" / "_manifest.json").read_text())["tokenizer"]["sha256"]
    assert wrong.returncode == 2 and "is not the one the run used" in wrong.stderr
    assert str(other) in wrong.stderr and sha_run[:12] in wrong.stderr and "--tokenizer" in wrong.stderr

    moved = etl("inspect", "out", "--row", "0", "--plain", "--tokenizer", "moved", cwd=tmp_path)
    assert moved.returncode == 0, moved.stderr
    assert "[[hello<|end|>]]" in moved.stdout


def test_input_type_hint_fires_for_records_longer_than_the_raw_preview(tmp_path: Path) -> None:
    turns = [{"from": "human", "value": "x" * 800}, {"from": "gpt", "value": "ok"}]
    records = [{"conversations": turns, "id": str(i)} for i in range(3)]
    assert all(len(json.dumps(r)) > 500 for r in records)  # longer than _rejects' raw preview
    (tmp_path / "sg.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    run = etl("run", "sg.jsonl", "out", cwd=tmp_path)
    assert run.returncode == 4, run.stderr  # nothing written
    assert "['conversations', 'id']: try --input-type sharegpt" in run.stderr


def test_missing_key_detail_names_the_record_keys_on_one_bounded_line(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    many = {"prompt": "p", **{f"key {i}\n" + "k" * 100: i for i in range(30)}}
    (tmp_path / "r.jsonl").write_text(json.dumps(many) + "\n")
    for input_type in ("chat", "instruction", "text", "transcript"):
        run = etl("run", "r.jsonl", "out", "--input-type", input_type, "--quiet", cwd=tmp_path)
        assert run.returncode == 4, run.stderr  # its one record rejected: nothing written
        (detail,) = pq.read_table(tmp_path / "out" / "_rejects").column("detail").to_pylist()
        assert '; record keys: ["prompt","key 0\\nkkk' in detail and detail.endswith("(+19 more)")
        assert "\n" not in detail and len(detail) < 700


def test_check_template_without_a_config_reads_as_a_table_and_hints(tmp_path: Path) -> None:
    tok = write_tiny_tokenizer(tmp_path / "tok")
    chats = [CHAT, {"messages": [{"role": "user", "content": "Print <|end|>"}, {"role": "assistant", "content": "ok"}]}]
    (tmp_path / "raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chats) + "{bad\n")
    shown = etl("check-template", "raw.jsonl", "--tokenizer", str(tok), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "{" not in out.split("first difference")[0]  # no Python dict or JSON dump
    assert "  records rejected, not checked" in out and "invalid_json 1" in out
    assert "verdict: every differing example has special-token text in its content" in out
    # The default system prompt is the template's own: nothing to hint at.
    assert "default system: etl inserts 'You are tiny.'; the chat_template's own is 'You are tiny.'" in out
    assert "hint: to insert" not in out
    (tmp_path / "cfg.json").write_text(json.dumps({"default_system": "Be brief."}))
    told = etl("check-template", "raw.jsonl", "--tokenizer", str(tok), "--config", "cfg.json", cwd=tmp_path).stdout
    assert "hint: to insert the chat_template's own system prompt where a conversation has none, use template " \
        'hf (auto\'s choice for this tokenizer) and leave default_system unset, or set "default_system": ' \
        '"You are tiny." in a --config file' in told


def test_check_template_on_another_layout_names_the_input_type_in_one_line(tmp_path: Path) -> None:
    tok = write_tiny_tokenizer(tmp_path / "tok")
    turns = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]
    (tmp_path / "sg.jsonl").write_text(json.dumps({"conversations": turns}) + "\n")
    failed = etl("check-template", "sg.jsonl", "--tokenizer", str(tok), cwd=tmp_path)
    assert failed.returncode == 2 and len(failed.stderr.strip().splitlines()) == 1
    assert "rejected 1 (missing_key 1)" in failed.stderr and "{" not in failed.stderr
    assert "try --input-type sharegpt" in failed.stderr
    fixed = etl("check-template", "sg.jsonl", "--tokenizer", str(tok), "--input-type", "sharegpt", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    assert "verdict: template hf gives the chat_template's ids on every example" in fixed.stdout
