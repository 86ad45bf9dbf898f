"""The report's plots, notes and facts for preference and unpaired outputs (`etl report`).

Same machinery as the SFT page (`etl.analysis.report_plots`): each `draw_*` fills one Axes from
one `sql/preference/` query's table; `pair_plots` makes the page's plots in order, as base64 PNGs.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from etl.analysis.report_plots import COLORS, draw_drops, mark_seq_len, plot_png
from etl.kinds import KINDS

# Shown as plots only, not as tables under them.
PLOTTED_ONLY = ("part_length_histogram", "length_difference")
PART_COLORS = {
    "prompt": COLORS[0],
    "chosen": COLORS[2],
    "rejected": COLORS[3],
    "completion": COLORS[1],
}
LONGER, SHORTER = COLORS[2], COLORS[3]  # chosen longer (or scored higher) / shorter than rejected
EQUAL, UNSCORED = "#999999", "#dddddd"

NOTES = {
    "pairs": "One row per pair. tokens: prompt + chosen + rejected, each prompt once (the "
    "prefix-shared layout); unshared_tokens: the same pairs as chosen-then-rejected rows (prompt "
    "twice); shared_saving: the share prefix sharing saves. *_trained: completion tokens with loss.",
    "part_lengths": "Tokens per part; total is num_tokens (what a packer bins). Percentiles are "
    "observed lengths.",
    "length_bias": "Pairs whose chosen completion is longer / as long / shorter than the rejected "
    "one: DPO learns a length bias when chosen_longer_share is far from 0.5.",
    "scores": "Pairs with both scores, and among them ties (equal scores: no margin to learn).",
    "truncation": "Pairs cut or that lost prompt turns under the run's policy; over_shared_seq_len: "
    "written pairs whose prefix-shared layout exceeds seq_len (they fit only as separate rows). "
    "Pairs dropped by reason: drops.",
    "labels": "Rows labelled desirable (true) and undesirable (false), and completion length per label.",
    "drops": "Manifest counts against what the Parquet shows; accounting_gap must be 0.",
    "rejects": "Input rows that could not be used, with the first one per reason.",
    "packing": "Sequences of seq_len needed for num_tokens (a pair laid out once: prompt, chosen, "
    "rejected) padded versus packed; packed_lower_bound is a bound.",
}


def pair_plots(
    results: dict[str, pa.Table], seq_len: int | None, kind: str
) -> list[dict[str, str]]:
    """The page's plots for a pair kind (etl.kinds.KINDS), from `run_queries` results."""
    names = [ids.removesuffix("_ids") for ids, _ in KINDS[kind].parts]
    parts = f"{', '.join(names[:-1])} and {names[-1]}"
    figures = [
        plot_png(
            f"Lengths of {parts}",
            "Rows per length bin of each part over every split; dashed: seq_len when within the axis.",
            draw_part_lengths,
            results["part_length_histogram"],
            seq_len,
        )
    ]
    if KINDS[kind].paired:
        figures += [
            plot_png(
                "Chosen minus rejected length",
                "Pairs per bin of num_chosen_tokens - num_rejected_tokens; green: chosen longer, "
                "red: chosen shorter, grey: equal lengths (a bin of its own).",
                draw_length_difference,
                results["length_difference"],
                results["length_bias"],
            ),
            plot_png(
                "Length bias and score ties",
                "All pairs by which completion is longer, and scored pairs by which one scores higher.",
                draw_pair_outcomes,
                results["length_bias"],
                results["scores"],
            ),
        ]
    else:
        figures.append(
            plot_png("Label balance", "Rows per split by label.", draw_labels, results["labels"])
        )
    figures.append(
        plot_png(
            f"Where {KINDS[kind].card.rows} went",
            "Manifest counts: written, truncated, dropped (e.g. pair_too_long) and rejected.",
            draw_drops,
            results["drops"],
        )
    )
    return figures


def draw_part_lengths(ax: Any, hist: pa.Table, seq_len: int | None) -> None:
    """Rows per length bin, one translucent colour per part (prompt, chosen, rejected...)."""
    rows = hist.to_pydict()
    for part in dict.fromkeys(rows["part"]):  # the query's order: prompt first
        idx = [k for k, p in enumerate(rows["part"]) if p == part]
        starts = [rows["bin_start"][k] for k in idx]
        ax.bar(
            starts,
            [rows["rows"][k] for k in idx],
            width=rows["bin_end"][idx[0]] - starts[0],
            align="edge",
            alpha=0.5,
            color=PART_COLORS.get(part, COLORS[4]),
            label=part,
        )
    ax.set_xlabel("tokens per part")
    ax.set_ylabel("rows")
    _integer_counts(ax)
    if not hist.num_rows:
        return
    mark_seq_len(ax, max(rows["bin_end"]), seq_len, "tokens per part")


def draw_length_difference(ax: Any, hist: pa.Table, bias: pa.Table) -> None:
    """Pairs per bin of chosen - rejected tokens: green right of 0 (chosen longer), red left,
    grey the equal-length bin [0, 1) (one token wide, edged so it shows on a wide axis); the
    shares of the three over all pairs written in the corner."""
    r = hist.to_pydict()
    if not hist.num_rows:
        return
    starts, ends = r["bin_start"], r["bin_end"]
    colors = [LONGER if s > 0 else SHORTER if s < 0 else EQUAL for s in starts]
    widths = [e - s for s, e in zip(starts, ends)]
    ax.bar(starts, r["pairs"], width=widths, align="edge", color=colors, edgecolor=colors)
    ax.axvline(0, color="#444", linestyle="--", linewidth=1)
    ax.set_xlabel("chosen - rejected tokens")
    ax.set_ylabel("pairs")
    _integer_counts(ax)
    if (row := _all_row(bias)) and row["pairs"]:
        shares = (row["chosen_longer_share"], row["equal_share"], row["chosen_shorter_share"])
        ax.text(
            0.02,
            0.96,
            "chosen longer {:.0%}, equal {:.0%}, shorter {:.0%}".format(*shares),
            transform=ax.transAxes,
            va="top",
            fontsize=9,
        )


def draw_pair_outcomes(ax: Any, bias: pa.Table, scores: pa.Table) -> None:
    """Two stacked horizontal bars over all pairs: by length (longer / equal / shorter) and by
    score (higher / tie / lower / unscored), each segment labelled with its share."""
    length = _all_row(bias)
    score = _all_row(scores)
    if not length or not length["pairs"]:
        return
    ahead, behind = "chosen > rejected", "chosen < rejected"  # longer / higher, shorter / lower
    bars = {  # one legend entry per colour: green and red mean the same on both bars
        "length": [
            (ahead, length["chosen_longer"], LONGER),
            ("equal length", length["equal_length"], EQUAL),
            (behind, length["chosen_shorter"], SHORTER),
        ],
        "score": [
            (ahead, score["chosen_higher"], LONGER),
            ("score tie", score["ties"], COLORS[1]),
            (behind, score["chosen_lower"], SHORTER),
            ("no scores", score["pairs"] - score["scored"], UNSCORED),
        ],
    }
    shown: set[str] = set()
    for y, (name, segments) in enumerate(bars.items()):
        left = 0
        for label, n, color in segments:
            ax.barh(name, n, left=left, color=color, label=None if label in shown else label)
            shown.add(label)
            if n:  # the figure people look for: what share of all pairs each segment is
                ax.annotate(
                    f"{n / length['pairs']:.0%}",
                    (left + n / 2, y),
                    ha="center",
                    va="center",
                    fontsize=9,
                )
            left += n
    ax.invert_yaxis()
    ax.set_xlabel("pairs")


def draw_labels(ax: Any, labels: pa.Table) -> None:
    """Rows per split, stacked: desirable (true) then undesirable (false)."""
    r = labels.to_pydict()
    idx = [k for k, s in enumerate(r["split"]) if s != "(all)"]
    if not idx:
        return
    splits = [r["split"][k] for k in idx]
    good = [r["desirable"][k] for k in idx]
    ax.bar(splits, good, color=LONGER, label="desirable (true)")
    ax.bar(
        splits,
        [r["undesirable"][k] for k in idx],
        bottom=good,
        color=SHORTER,
        label="undesirable (false)",
    )
    ax.set_ylabel("rows")
    _integer_counts(ax)


def pair_facts(manifest: dict[str, Any], kind: str) -> list[tuple[str, Any]]:
    """The page's extra facts for a pair kind: the kind, truncation policy and pair fit."""
    preference = manifest.get("preference") or {}
    facts = [("kind", kind), ("truncation", (manifest.get("config") or {}).get("truncation"))]
    if KINDS[kind].paired:
        facts += [
            ("pair fit", preference.get("fit")),
            ("over shared seq_len", preference.get("over_shared_seq_len")),
        ]
    return facts


def _integer_counts(ax: Any) -> None:
    # matplotlib: only when a plot is drawn (docs/design.md, Imports)
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts: no 0.25-row ticks


def _all_row(table: pa.Table) -> dict[str, Any] | None:
    return next((row for row in table.to_pylist() if row["split"] == "(all)"), None)
