"""Command-line rough edges a new user and an adversarial tester hit (issue 37): each test runs
the command as they did and checks its one line."""

from __future__ import annotations

import json
from pathlib import Path

from tests.commands.test_rough_edges import etl

CHATS = [
    {"messages": [{"role": "user", "content": f"question number {i}, asked at some length"},
                  {"role": "assistant", "content": f"answer {i}"}]}
    for i in range(5)
]


def _chats(folder: Path) -> Path:
    src = folder / "raw.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in CHATS))
    return src


def test_a_seq_len_too_short_for_the_headers_warns_with_the_count(tmp_path: Path) -> None:
    _chats(tmp_path)
    short = etl("run", "raw.jsonl", "out", "--seq-len", "16", "--quiet", cwd=tmp_path)
    assert short.returncode == 0, short.stderr
    assert short.stderr.strip().splitlines() == [
        ("etl run: warning: 5 of 5 examples written were cut through a turn's header to fit --seq-len 16 "
        "(truncation drop_oldest_turns: the window starts or ends inside a turn); raise --seq-len, or pass "
        "--truncation drop to drop what does not fit")]
    assert json.loads((tmp_path / "out" / "_manifest.json").read_text())["counts"]["header_cut"] == 5

    roomy = etl("run", "raw.jsonl", "out2", "--quiet", cwd=tmp_path)
    assert roomy.returncode == 0 and roomy.stderr == ""
    assert "header_cut" not in json.loads((tmp_path / "out2" / "_manifest.json").read_text())["counts"]
