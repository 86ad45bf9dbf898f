"""Mixtures end to end: `etl run --config mix.toml DST` with several sources, each with its own options.

Inputs are written here (byte tokenizer: a character of ASCII text is one token), so token
counts and shares can be worked out by hand.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from etl.cli import main
from etl.output.manifest import read_manifest

SYSTEM_A, SYSTEM_B = "Answer briefly.", "Chat freely."


def write_jsonl(path: Path, records: list[dict[str, object]]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def chats(n: int, *, key: str = "messages", role: str = "role", text: str = "content", words: int = 8) -> list[dict]:
    """n two-turn chats of varied length, under the given keys."""
    return [{key: [{role: "user", text: f"question {i} " + "x" * (i % 13)},
                   {role: "assistant", text: f"answer {i} " + "yz " * (words + i % 7)}]} for i in range(n)]


def write_config(path: Path, doc: str) -> str:
    path.write_text(doc, encoding="utf-8")
    return str(path)


@pytest.fixture
def two_sources(tmp_path: Path) -> tuple[str, str]:
    """A source `qa` (keys messages/role/content) and a source `talk` (keys turns/speaker/text)."""
    qa = write_jsonl(tmp_path / "in" / "qa.jsonl", chats(400))
    talk = write_jsonl(tmp_path / "in" / "talk.jsonl", chats(300, key="turns", role="speaker", text="text", words=20))
    return qa, talk


def mix_config(tmp_path: Path, qa: str, talk: str, extra: str = "", qa_extra: str = "", talk_extra: str = "") -> str:
    return write_config(tmp_path / "mix.toml", f"""
seq_len = 4096
{extra}
[[sources]]
name = "qa"
path = "{qa}"
default_system = "{SYSTEM_A}"
{qa_extra}
[[sources]]
name = "talk"
path = "{talk}"
default_system = "{SYSTEM_B}"
input = {{ messages_key = "turns", role_key = "speaker", content_key = "text" }}
{talk_extra}
""")


def run(config: str, dst: Path, *args: str) -> dict:
    assert main(["run", "--config", config, str(dst), "--quiet", *args]) == 0
    return read_manifest(dst)


def data(dst: Path) -> dict[str, list]:
    return pq.read_table(dst / "data").to_pydict()


def turns(dst: Path) -> dict[str, list]:
    return pq.read_table(dst / "turns").to_pydict()


def test_each_source_keeps_its_system_prompt_and_input_keys(tmp_path: Path, two_sources: tuple[str, str]) -> None:
    dst = tmp_path / "out"
    manifest = run(mix_config(tmp_path, *two_sources), dst)
    rows = data(dst)
    assert manifest["counts"]["rejected"] == {}  # talk's keys were read as its input says
    for sid, domain, ids in zip(rows["id"], rows["domain"], rows["input_ids"], strict=True):
        text = bytes(i for i in ids if i < 256).decode()
        source = sid.split("/")[0]
        assert domain == source
        assert (SYSTEM_A if source == "qa" else SYSTEM_B) in text
        assert (SYSTEM_B if source == "qa" else SYSTEM_A) not in text
    assert {s.split("/")[0] for s in rows["source_file"]} == {"qa", "talk"}


def test_each_source_keeps_its_mask_rule(tmp_path: Path, two_sources: tuple[str, str]) -> None:
    """talk trains user turns too (mask extends the top level's assistant rule); qa does not."""
    dst = tmp_path / "out"
    run(mix_config(tmp_path, *two_sources, talk_extra='mask = { user = "train" }'), dst)
    t = turns(dst)
    trained = {(i.split("/")[0], r): tr for i, r, tr in zip(t["id"], t["role"], t["trained"], strict=True)}
    assert trained[("qa", "user")] is False and trained[("qa", "assistant")] is True
    assert trained[("talk", "user")] is True and trained[("talk", "assistant")] is True


def test_each_source_keeps_its_max_items_and_truncation(tmp_path: Path, two_sources: tuple[str, str]) -> None:
    dst = tmp_path / "out"
    manifest = run(mix_config(tmp_path, *two_sources, qa_extra="max_items = 50"), dst)
    by_name = {s["name"]: s for s in manifest["mixture"]["sources"]}
    assert by_name["qa"]["counts"]["read"] == 50 and by_name["talk"]["counts"]["read"] == 300


def token_shares(dst: Path) -> dict[str, float]:
    rows = data(dst)
    total = sum(rows["num_tokens"])
    shares: dict[str, float] = {}
    for sid, n in zip(rows["id"], rows["num_tokens"], strict=True):
        shares[sid.split("/")[0]] = shares.get(sid.split("/")[0], 0) + n / total
    return shares


@pytest.mark.parametrize("total", ["sum", "first_exhausted", "all_exhausted"])
def test_weights_give_token_shares_within_one_percent(tmp_path: Path, two_sources: tuple[str, str], total: str) -> None:
    dst = tmp_path / "out"
    config = mix_config(tmp_path, *two_sources, extra=f'mix_total = "{total}"', qa_extra="weight = 3",
                        talk_extra="weight = 1")
    manifest = run(config, dst)
    shares = token_shares(dst)
    assert shares["qa"] == pytest.approx(0.75, abs=0.01) and shares["talk"] == pytest.approx(0.25, abs=0.01)
    for entry in manifest["mixture"]["sources"]:
        assert entry["share_met"] and entry["realised_share"] == pytest.approx(shares[entry["name"]], abs=1e-4)
        c = entry["counts"]
        assert c["read"] == c["written"] + sum(c["dropped"].values()) + sum(c["rejected"].values())
    n = manifest["counts"]
    assert n["read"] == n["written"] + sum(n["dropped"].values()) + sum(n["rejected"].values())
    assert len(data(dst)["id"]) == n["written"] + n["repeated"]
    repeats = {e["name"]: e["repeat"] for e in manifest["mixture"]["sources"]}
    if total == "first_exhausted":
        assert max(repeats.values()) == pytest.approx(1.0, abs=0.01)  # the limiting source, once
        assert all(r <= 1.0 for r in repeats.values())
    if total == "all_exhausted":
        assert min(repeats.values()) == pytest.approx(1.0, abs=0.01) and all(r >= 1.0 for r in repeats.values())


def test_examples_mode_and_epochs(tmp_path: Path, two_sources: tuple[str, str]) -> None:
    """Without weights, epochs repeat each source: 0.5 keeps half of qa, 2.5 writes talk 2.5 times."""
    dst = tmp_path / "out"
    config = mix_config(tmp_path, *two_sources, extra='mix_by = "examples"', qa_extra="epochs = 0.5",
                        talk_extra="epochs = 2.5")
    manifest = run(config, dst)
    rows = data(dst)
    per = {name: sum(i.startswith(name + "/") for i in rows["id"]) for name in ("qa", "talk")}
    assert per == {"qa": 200, "talk": 750}
    talk = {e["name"]: e for e in manifest["mixture"]["sources"]}["talk"]
    assert talk["counts"]["written"] == 300 and talk["counts"]["repeated"] == 450
    assert talk["requested_share"] == pytest.approx(750 / 950, abs=1e-4)


def test_copies_have_distinct_ids_turns_and_their_records_split(tmp_path: Path, two_sources: tuple[str, str]) -> None:
    dst = tmp_path / "out"
    config = mix_config(tmp_path, *two_sources, extra="[split]\nval_fraction = 0.2", talk_extra="epochs = 3")
    run(config, dst)
    rows = data(dst)
    assert len(set(rows["id"])) == len(rows["id"])
    split_of = dict(zip(rows["id"], rows["split"], strict=True))
    ids_of = dict(zip(rows["id"], rows["input_ids"], strict=True))
    copies = [i for i in rows["id"] if "#" in i]
    assert len(copies) == 600 and {i.rsplit("#", 1)[1] for i in copies} == {"2", "3"}
    for copy in copies:
        first = copy.rsplit("#", 1)[0]
        assert split_of[copy] == split_of[first] and ids_of[copy] == ids_of[first]
    t = turns(dst)
    per_id: dict[str, int] = {}
    for i in t["id"]:
        per_id[i] = per_id.get(i, 0) + 1
    assert set(per_id) == set(rows["id"]) and all(per_id[c] == per_id[c.rsplit("#", 1)[0]] for c in copies)
    assert main(["stats", str(dst), "--query", "consistency", "--format", "json"]) == 0


def digests(dst: Path) -> dict[str, str]:
    return {str(p.relative_to(dst)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((dst / "data").rglob("*.parquet"))}


def test_reruns_are_byte_identical_and_the_seed_only_changes_the_draw(tmp_path: Path,
                                                                      two_sources: tuple[str, str]) -> None:
    qa, talk = two_sources
    config = mix_config(tmp_path, qa, talk, qa_extra="weight = 1", talk_extra="weight = 1")
    run(config, tmp_path / "a")
    run(config, tmp_path / "b")
    assert digests(tmp_path / "a") == digests(tmp_path / "b")
    reseeded = write_config(tmp_path / "seed.toml", "seed = 7\n" + Path(config).read_text())
    run(reseeded, tmp_path / "c")
    a, c = data(tmp_path / "a"), data(tmp_path / "c")
    assert set(a["id"]) != set(c["id"])  # other records drawn...
    tokens_a = dict(zip(a["id"], a["input_ids"], strict=True))
    for i, ids in zip(c["id"], c["input_ids"], strict=True):  # ...each one tokenized as before
        if i in tokens_a:
            assert tokens_a[i] == ids
    assert token_shares(tmp_path / "c") == pytest.approx(token_shares(tmp_path / "a"), abs=0.01)


def test_a_source_too_small_for_its_share_says_so_and_keeps_its_epochs_cap(
        tmp_path: Path, two_sources: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    qa, talk = two_sources
    config = mix_config(tmp_path, qa, talk, extra='mix_total = "all_exhausted"', qa_extra="weight = 1",
                        talk_extra="weight = 9\nepochs = 2")
    assert main(["run", "--config", config, str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "too small" in line]
    assert len(lines) == 1 and "talk" in lines[0] and "epochs=2" in lines[0]
    talk = {e["name"]: e for e in read_manifest(tmp_path / "out")["mixture"]["sources"]}["talk"]
    assert talk["repeat"] == pytest.approx(2.0, abs=0.01) and not talk["share_met"]
    assert talk["counts"]["repeated"] == 300


@pytest.mark.parametrize(("extra", "qa_extra", "talk_extra", "message"), [
    ("", "weight = 1", "", "sources[1] without a weight"),
    ("", 'name = "talk"', "", "like an earlier source"),
    ('mix_total = "sum"', "", "", "mix_total sizes a weighted mixture"),
    ("", "weight = -1", "", "sources[0].weight must be a positive number"),
    ("", "tokenizer = 'x'", "", "unknown key sources[0].tokenizer"),
])
def test_bad_mixtures_name_the_problem(tmp_path: Path, two_sources: tuple[str, str], extra: str, qa_extra: str,
                                       talk_extra: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    config = mix_config(tmp_path, *two_sources, extra=extra, qa_extra=qa_extra, talk_extra=talk_extra)
    config = write_config(Path(config), Path(config).read_text().replace('name = "qa"\n', "", 1)
                          if 'name = "talk"' in qa_extra else Path(config).read_text())
    assert main(["run", "--config", config, str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_src_is_left_out_and_ray_is_refused(tmp_path: Path, two_sources: tuple[str, str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    config = mix_config(tmp_path, *two_sources)
    assert main(["run", "--config", config, "somewhere", str(tmp_path / "out")]) == 2
    assert "SRC is left out" in capsys.readouterr().err
    assert main(["run", "--config", config, str(tmp_path / "out"), "--engine", "ray"]) == 2
    assert "local engine" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "out")]) == 2
    assert "needs SRC and DST" in capsys.readouterr().err


def test_no_sources_keeps_the_manifest_as_before(tmp_path: Path, two_sources: tuple[str, str]) -> None:
    qa, _ = two_sources
    assert main(["run", qa, str(tmp_path / "out"), "--quiet"]) == 0
    manifest = read_manifest(tmp_path / "out")
    assert "mixture" not in manifest and "mixture" not in manifest["config"]
    assert "repeated" not in manifest["counts"]
    assert pc.all(pc.equal(pq.read_table(tmp_path / "out" / "data").column("domain"), "__default__")).as_py()


ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"


@pytest.mark.skipif(not (SHARED / "qwen2.5-tokenizer").is_dir(), reason="needs ../shared/data")
def test_the_example_mixture_runs_in_one_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/configs/mixture.toml: alpaca, FastChat and glaive, 50/30/20 by tokens, own prompts."""
    monkeypatch.chdir(ROOT)  # its paths are relative to the repository's root
    manifest = run(str(ROOT / "examples" / "configs" / "mixture.toml"), tmp_path / "mix")
    shares = token_shares(tmp_path / "mix")
    assert shares == pytest.approx({"alpaca": 0.5, "fastchat": 0.3, "glaive": 0.2}, abs=0.01)
    assert all(e["share_met"] for e in manifest["mixture"]["sources"])
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(SHARED / "qwen2.5-tokenizer" / "tokenizer.json"))
    rows = pq.read_table(tmp_path / "mix" / "data").slice(0, 4000).to_pydict()
    prompts = {"alpaca": "precise assistant", "fastchat": "friendly chat assistant", "glaive": "call the functions"}
    seen = set()
    for sid, ids in zip(rows["id"], rows["input_ids"], strict=True):
        name = sid.split("/")[0]
        if name not in seen:
            seen.add(name)
            assert prompts[name] in tok.decode(ids)
    assert seen == set(prompts)
