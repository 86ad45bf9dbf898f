"""Command-line rough edges a new user and an adversarial tester hit (issue 37): each test runs
the command as they did and checks its one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


def _rejects(dst: Path) -> dict[int, tuple[str, str]]:
    import pyarrow.parquet as pq

    table = pq.read_table(dst / "_rejects").to_pylist()
    return {r["source_line"]: (r["reason"], r["detail"]) for r in table}


def test_a_score_must_be_a_finite_json_number(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    pair = '{"prompt": "hi", "chosen": "good", "rejected": "bad", "score_rejected": 1, "score_chosen": '
    scores = ["9", "-2.5", '"9"', "true", "NaN", "Infinity", "1e999", '"inf"', "null"]
    (tmp_path / "p.jsonl").write_text("".join(pair + s + "}\n" for s in scores))
    run = etl("run", "p.jsonl", "out", "--input-type", "preference", "--quiet", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    written = pq.read_table(tmp_path / "out" / "data").to_pylist()
    assert [(r["source_line"], r["score_chosen"]) for r in written] == [(0, 9.0), (1, -2.5), (8, None)]
    assert _rejects(tmp_path / "out") == {
        2: ("bad_score", '"score_chosen" is a string, not a finite number'),
        3: ("bad_score", '"score_chosen" is a boolean, not a finite number'),
        **{i: ("bad_score", '"score_chosen" is NaN or infinite, not a finite number') for i in (4, 5, 6)},
        7: ("bad_score", '"score_chosen" is a string, not a finite number'),
    }


def test_a_kto_record_without_a_user_turn_is_named_so(tmp_path: Path) -> None:
    records = [{"completion": [{"role": "assistant", "content": "x"}], "label": True},
               {"completion": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}],
                "label": False},
               {"completion": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                "label": True}]
    (tmp_path / "k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    run = etl("run", "k.jsonl", "out", "--input-type", "unpaired", "--quiet", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    rejects = _rejects(tmp_path / "out")
    assert rejects[0][0] == "no_user_turn" and "give the record a prompt or a user message" in rejects[0][1]
    assert rejects[1][0] == "empty_completion" and set(rejects) == {0, 1}


QWEN3 = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "qwen3-tokenizer"


def _pair(user: str, chosen: dict[str, object], rejected: str) -> dict[str, object]:
    ask = {"role": "user", "content": user}
    return {"chosen": [ask, chosen], "rejected": [ask, {"role": "assistant", "content": rejected}]}


@pytest.mark.shared
@pytest.mark.skipif(not QWEN3.exists(), reason="../shared data absent")
def test_check_template_classifies_pairs_with_tool_calls_and_special_text(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    pairs = [_pair("weather?", {"role": "assistant", "content": "", "tool_calls": [call]}, "no idea"),
             _pair("think", {"role": "assistant", "content": "<think>\nhm\n</think>\n\nok"}, "no"),
             _pair("Print <|im_end|> now", {"role": "assistant", "content": "<|im_end|>"}, "no")]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    done = etl("check-template", "p.jsonl", "--input-type", "preference", "--tokenizer", str(QWEN3), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "pairs checked                                         3" in done.stdout
    assert "differ: special_text                                  1" in done.stdout
    assert "equal to TRL (prompt, chosen, rejected ids)           2" in done.stdout


def test_a_pair_trl_cannot_prepare_is_its_own_verdict(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("trl")
    from etl.analysis.trl_pairs import trl_rows
    from tests.commands.test_rough_edges import write_tiny_tokenizer

    tok = transformers.AutoTokenizer.from_pretrained(str(write_tiny_tokenizer(tmp_path / "tok")))
    good = _pair("hi", {"role": "assistant", "content": "yo"}, "no")
    rows = trl_rows([good, {"chosen": [], "rejected": good["rejected"]}], tok)
    assert rows[0] is not None and rows[0]["chosen_ids"] and rows[1] is None


def test_inspect_pack_and_export_on_pairs_say_what_to_do_and_leave_nothing(tmp_path: Path) -> None:
    pair = {"prompt": "hi", "chosen": "good", "rejected": "bad"}
    (tmp_path / "p.jsonl").write_text(json.dumps(pair) + "\n")
    assert etl("run", "p.jsonl", "out", "--input-type", "preference", "--quiet", cwd=tmp_path).returncode == 0
    assert etl("pack", "out", "--seq-len", "64", "--strategy", "bfd", cwd=tmp_path).returncode == 0
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    shown = etl("inspect", "out", "--pack", "0", cwd=tmp_path)
    assert shown.returncode == 2 and shown.stderr.count("\n") == 1, shown.stderr
    assert "holds preference rows; `etl inspect out --row N` shows one of them" in shown.stderr
    for fmt, out in (("episodes", "ex"), ("bin", "out")):
        done = etl("export", "out", out, "--format", fmt, cwd=tmp_path)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "out holds preference pairs (prompt, chosen, rejected), and export writes SFT token" in done.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # no _journal.jsonl, no ex/


def _write_limited(nbytes: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))


def test_a_file_size_limit_is_one_line_naming_the_file_and_nothing_looks_finished(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    import pyarrow.parquet as pq

    text = " ".join(str(i * 7919 % 10007) for i in range(3000))  # ~17 KB that compresses little
    big = {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": text}]}
    (tmp_path / "raw.jsonl").write_text(json.dumps(big) + "\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-m", "etl", "run", "raw.jsonl", "out", "--quiet"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, check=False, preexec_fn=lambda: _write_limited(4096))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("etl run: error: file size limit reached (ulimit -f) while writing out/")
    assert ".parquet; raise it (ulimit -f unlimited)" in done.stderr
    assert not (tmp_path / "out" / "_manifest.json").exists()
    for part in (tmp_path / "out").rglob("*.parquet"):  # a part under its final name is whole
        pq.read_metadata(part)


def test_a_read_only_parent_is_one_line_naming_the_folder(tmp_path: Path) -> None:
    import os
    import shutil
    import subprocess
    import sys

    # root writes anywhere: drop that capability (setpriv) so the folder's mode counts
    prefix = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
    _chats(tmp_path)
    (tmp_path / "ro").mkdir(mode=0o555)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([*prefix, sys.executable, "-m", "etl", "run", "raw.jsonl", "ro/out", "--quiet"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ("etl run: error: ro/out: permission denied; make it (and the folder it is in) "
                           "accessible to you, or choose another path\n")
    assert list((tmp_path / "ro").iterdir()) == []
