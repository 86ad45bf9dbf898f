"""The `mixture` query and the report's mixture plot, on a hand-made mixture output.

Every example is one user turn and one assistant turn of runs of one letter, so with the fixture's
`bytes` template a turn of n letters is n + 3 tokens (header, eot, separator) and an assistant
turn trains n + 1 (content and eot): each figure below is worked out by hand from that.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from etl.analysis.report import build_report
from etl.analysis.report_plots import MIXTURE_TITLE
from etl.analysis.stats import query_names, run_query
from tests.analysis.stats_fixtures import Example, Turn, write_dst

FILES = {
    "alpaca": "alpaca_en_demo.json",
    "glaive": "glaive_toolcall_en_demo.json",
    "chat": "sharegpt.jsonl",
    "dolly": "dolly.jsonl",
}


def qa(
    example_id: str, source: str, domain: str, user: int, assistant: int, split: str = "train"
) -> Example:
    """An example of `user` + `assistant` letters: (user + 3) + (assistant + 3) tokens."""
    turns = [Turn("user", "u" * user), Turn("assistant", "a" * assistant)]
    return Example(example_id, split, domain, turns, source_file=f"{source}/{FILES[source]}")


# fmt: off
# source  rows (copies)  tokens                            trained        domains
# alpaca  3 (1)          (4+6) + (4+2)x2 + 6 turns x 3 = 40  7+3+3 = 13     alpaca
# glaive  2 (0)          26 + 14 = 40 (gl-1 in val)          11+4 = 15      tools
# chat    4 (2)          13x3 + 41 = 80                      6x3+21 = 39    chat, tools (shared)
# dolly   0              0 (every row dropped)               0              (manifest's: dolly)
# all     9 (3)          160: token shares .25 .25 .5 0; example shares 3/9 2/9 4/9 0
EXAMPLES = [
    qa("al-0", "alpaca", "alpaca", 4, 6),          # 7 + 9 = 16 tokens, 7 trained
    qa("al-1", "alpaca", "alpaca", 4, 2),          # 7 + 5 = 12, 3
    qa("al-1#2", "alpaca", "alpaca", 4, 2),        # its up-sampled copy
    qa("gl-0", "glaive", "tools", 10, 10),         # 13 + 13 = 26, 11
    qa("gl-1", "glaive", "tools", 5, 3, "val"),    # 8 + 6 = 14, 4
    qa("ch-0", "chat", "chat", 2, 5),              # 5 + 8 = 13, 6
    qa("ch-0#2", "chat", "chat", 2, 5),
    qa("ch-0#3", "chat", "chat", 2, 5),
    qa("ch-1", "chat", "tools", 15, 20),           # 18 + 23 = 41, 21
]
# fmt: on

REQUESTED = {"alpaca": 0.3, "glaive": 0.2, "chat": 0.45, "dolly": 0.05}
# The run's own realised shares; glaive's is off by 1e-4 on purpose, so the test can tell the
# manifest's figure from the recount.
RECORDED = {"alpaca": 0.25, "glaive": 0.2499, "chat": 0.5, "dolly": 0.0}
COUNTS = {
    "read": 12,
    "written": 6,
    "truncated": 0,
    "repeated": 3,
    "dropped": {"not_drawn": 5, "no_trained_tokens": 1},
    "rejected": {},
}


def mixture(mix_by: str) -> dict[str, Any]:
    """The manifest's `mixture` key as `etl run` writes it (what the query reads, and the rest)."""
    sources = [
        {
            "name": name,
            "domain": name,
            "path": f"../shared/data/{FILES[name]}",
            "weight": share,
            "epochs": None,
            "requested_share": share,
            "realised_share": RECORDED[name],
            "repeat": 1.0,
            "before": {},
            "counts": {},
            "note": None,
        }
        for name, share in REQUESTED.items()
    ]
    return {"mix_by": mix_by, "seed": 0, "sources": sources}


def write_mixture_dst(root: Path, mix_by: str) -> Path:
    extra = {"mixture": mixture(mix_by), "splits": {"train": 8, "val": 1}}
    return write_dst(root, EXAMPLES, counts=COUNTS, rejects=None, extra=extra)


@pytest.fixture(scope="module")
def mix_dst(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mixture_dst(tmp_path_factory.mktemp("mix"), "tokens")


def test_mixture(mix_dst: Path) -> None:
    got = run_query(mix_dst, "mixture").to_pylist()
    # fmt: off
    assert got == [
        {"source": "alpaca", "domain": "alpaca", "mix_by": "tokens", "examples": 3, "copies": 1,
         "tokens": 40, "trained_tokens": 13, "requested_share": 0.3, "realised_share": 0.25,
         "difference": -0.05, "manifest_realised_share": 0.25},
        {"source": "glaive", "domain": "tools", "mix_by": "tokens", "examples": 2, "copies": 0,
         "tokens": 40, "trained_tokens": 15, "requested_share": 0.2, "realised_share": 0.25,
         "difference": 0.05, "manifest_realised_share": 0.2499},
        {"source": "chat", "domain": "chat, tools", "mix_by": "tokens", "examples": 4, "copies": 2,
         "tokens": 80, "trained_tokens": 39, "requested_share": 0.45, "realised_share": 0.5,
         "difference": 0.05, "manifest_realised_share": 0.5},
        {"source": "dolly", "domain": "dolly", "mix_by": "tokens", "examples": 0, "copies": 0,
         "tokens": 0, "trained_tokens": 0, "requested_share": 0.05, "realised_share": 0.0,
         "difference": -0.05, "manifest_realised_share": 0.0},
    ]
    # fmt: on
    assert query_names().index("mixture") == query_names().index("domains") + 1


def test_mixture_by_examples(tmp_path: Path) -> None:
    got = run_query(write_mixture_dst(tmp_path, "examples"), "mixture").to_pylist()
    # 3, 2, 4 and 0 of the 9 data rows (copies count: they are trained on)
    assert [r["realised_share"] for r in got] == [0.3333, 0.2222, 0.4444, 0.0]
    assert [r["difference"] for r in got] == [0.0333, 0.0222, -0.0056, -0.05]
    assert {r["mix_by"] for r in got} == {"examples"}


def test_mixture_of_an_ordinary_run_has_no_rows(dst: Path, empty_dst: Path) -> None:
    for plain in (dst, empty_dst):
        table = run_query(plain, "mixture")
        assert table.num_rows == 0
        assert "realised_share" in table.column_names


def test_mixture_on_the_command_line(mix_dst: Path, cli: Any) -> None:
    proc = cli("stats", str(mix_dst), "--query", "mixture", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert [r["copies"] for r in json.loads(proc.stdout)] == [1, 0, 2, 0]
    proc = cli("stats", str(mix_dst), "--query", "mixture", "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    header, *rows = proc.stdout.strip().splitlines()
    assert header.startswith('"source","domain","mix_by","examples","copies"') and len(rows) == 4
    proc = cli("stats", str(mix_dst), "--query", "mixture")
    assert proc.returncode == 0 and "chat, tools" in proc.stdout, proc.stderr


def test_report_plots_the_mixture_only_for_a_mixture_run(mix_dst: Path, dst: Path) -> None:
    html = build_report(mix_dst)
    assert f'alt="{MIXTURE_TITLE}"' in html and html.count('<img alt="') == 5
    assert '<h2 id="mixture">' in html and "chat, tools" in html
    assert "alpaca, glaive, chat, dolly by tokens (seed 0)" in html  # the facts at the top
    plain = build_report(dst)
    assert MIXTURE_TITLE not in plain and plain.count('<img alt="') == 4
    assert "by tokens (seed" not in plain


def test_mixture_plot_bars_are_the_shares(mix_dst: Path) -> None:
    from etl.analysis.report_plots import draw_mixture, figure

    (ax,) = figure("mixture", draw_mixture, run_query(mix_dst, "mixture")).axes
    heights = [round(bar.get_height(), 4) for bar in ax.patches]
    assert heights == [0.3, 0.2, 0.45, 0.05, 0.25, 0.25, 0.5, 0.0]  # requested, then realised
    assert [t.get_text() for t in ax.get_xticklabels()] == ["alpaca", "glaive", "chat", "dolly"]
    assert [t.get_text() for t in ax.texts] == ["-5.0 pp", "+5.0 pp", "+5.0 pp", "-5.0 pp"]
    assert ax.get_ylabel() == "share of tokens"
