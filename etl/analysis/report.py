"""`etl report`: one self-contained HTML page of an etl output's statistics.

Figures come from the `sql/` queries (`etl.analysis.stats`); plots are matplotlib PNGs (Agg, no pyplot
state) embedded as base64, so the page opens anywhere with no network and no extra files.
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from etl.analysis.stats import QUERY_ORDER, default_bin_width, run_queries, run_query
from etl.errors import EtlError
from etl.output.manifest import read_manifest

# Tables shown under the plots, in `etl stats` order; the histogram and turns-per-example
# queries are shown as plots only. Row listings show their first rows (they can be long).
PLOTTED_ONLY = ("length_histogram", "turns_per_example")
TABLES = tuple(name for name in QUERY_ORDER if name not in PLOTTED_ONLY)
LISTING_ROWS = 20
COLORS = ("#3b75af", "#ef8636", "#519e3e", "#c53a32", "#8d69b8", "#84584e")
# Legend entries per row below a plot: four short labels fit the 6.4-inch figure.
LEGEND_COLUMNS = 4
X_MARGIN = 1.02  # the length axis ends just past the last bin (matplotlib's default margin is 5%)

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{ title }}</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: 13px; }
th, td { padding: 3px 9px; border-bottom: 1px solid #eee; text-align: right; }
th { background: #f5f5f5; } td.s, th.s { text-align: left; }
.plots { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; }
figure { margin: 0; } figure img { width: 100%; border: 1px solid #eee; }
figcaption, .note { color: #666; font-size: 12px; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 1em; } dt { color: #666; }
</style></head><body>
<h1>{{ title }}</h1>
<dl>{% for k, v in facts %}<dt>{{ k }}</dt><dd>{{ v }}</dd>{% endfor %}</dl>
<h2>Plots</h2>
<div class="plots">{% for p in plots %}
<figure><img alt="{{ p.title }}" src="data:image/png;base64,{{ p.png }}">
<figcaption>{{ p.caption }}</figcaption></figure>{% endfor %}
</div>
{% for t in tables %}<h2 id="{{ t.name }}">{{ t.name }}</h2>
<p class="note">{{ t.note }}</p>
{% if t.rows %}<table>
<tr>{% for c, s in t.columns %}<th class="{{ s }}">{{ c }}</th>{% endfor %}</tr>
{% for r in t.rows %}<tr>
{%- for v, (c, s) in zip(r, t.columns) %}<td class="{{ s }}">{{ v }}</td>{% endfor -%}
</tr>
{% endfor %}</table>{% else %}<p class="note">(no rows)</p>{% endif %}
{% if t.more %}<p class="note">… {{ t.more }} more rows:
etl stats DST --query {{ t.name }} --format csv</p>{% endif %}
{% endfor %}
</body></html>
"""

NOTES = {
    "lengths": "Tokens per example (input_ids length); percentiles are observed lengths.",
    "trained_share": "Tokens with loss_mask set; trained_in_mask recounts the mask itself.",
    "roles": "Turns and tokens per role; trained tokens counted from loss_mask inside each turn.",
    "domains": "Examples, tokens and truncation per domain and split.",
    "drops": "Manifest counts against what the Parquet shows; accounting_gap must be 0.",
    "rejects": "Input rows that could not be used, with the first one per reason.",
    "packing": "Sequences of seq_len needed padded (one example each) versus packed; "
    "packed_lower_bound is a bound, first-fit-decreasing lands at or slightly above.",
    "consistency": "Rules of the output layout; each count should be 0 (first_id: one to inspect).",
    "zero_trained": "Examples with no trained token (etl run drops these: expected empty).",
    "untrained_eot": "Trained assistant turns whose end-of-turn token carries no loss "
    "(expected when end-of-turn training is none/last).",
}


def build_report(dst: str | os.PathLike[str], *, title: str | None = None) -> str:
    """Render the HTML page of an etl output.

    Args:
        dst: the output folder of `etl run`.
        title: page title; "etl report: <dst>" when None.

    Returns:
        The HTML text, with every plot embedded.
    """
    import jinja2

    matplotlib_figure()  # before any query: a missing optional dependency fails in milliseconds
    manifest = read_manifest(dst)
    results = run_queries(dst, bin_width=histogram_bin_width(dst))
    plots = [
        _plot(
            "Example lengths",
            "Examples per length bin, per split, over the data's range; dashed: seq_len "
            "(named under the axis when it lies beyond).",
            _draw_lengths,
            results["length_histogram"],
            manifest.get("seq_len"),
        ),
        _plot(
            "Tokens by role (trained share)",
            "Kept tokens per role, trained or not, and tokens of dropped turns.",
            _draw_roles,
            results["roles"],
        ),
        _plot(
            "Turns per example",
            "Turns per conversation (dropped ones included), per split; "
            "hatched: examples that lost turns to truncation.",
            _draw_turns,
            results["turns_per_example"],
        ),
        _plot(
            "Where examples went",
            "Manifest counts: written, truncated, dropped and rejected.",
            _draw_drops,
            results["drops"],
        ),
    ]
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    return env.from_string(PAGE).render(
        title=title or f"etl report: {dst}",
        facts=_facts(dst, manifest),
        plots=plots,
        tables=[_table(name, results[name]) for name in TABLES],
        zip=zip,
    )


def histogram_bin_width(dst: str | os.PathLike[str]) -> int:
    """Length-histogram bins fitted to the longest example, not to seq_len.

    Bins over 0..S would put short data under a long S (100-token chats, S = 32k) into the
    first bin or two; ~`etl.analysis.stats.HISTOGRAM_BINS` bins over the data's own range show its shape.
    """
    longest = [v for v in run_query(dst, "lengths").column("max").to_pylist() if v is not None]
    return default_bin_width(max(longest, default=1))


def write_report(dst: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Render the report of `dst` and write it to `out` (folders created as needed)."""
    path = Path(out)
    if path.is_dir():
        raise EtlError(
            f"{out} is a folder: give the report a file name, e.g. {path / 'report.html'}"
        )
    html = build_report(dst)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    return path


def _facts(dst: str | os.PathLike[str], manifest: dict[str, Any]) -> list[tuple[str, Any]]:
    tok = manifest.get("tokenizer") or {}
    counts = manifest.get("counts") or {}
    return [
        ("output", str(dst)),
        ("tokenizer", f"{tok.get('name')} (vocab {tok.get('vocab_size')})"),
        ("template", (manifest.get("template") or {}).get("name")),
        ("seq_len", manifest.get("seq_len")),
        ("read / written", f"{counts.get('read')} / {counts.get('written')}"),
        ("truncated", counts.get("truncated")),
        ("dropped", sum((counts.get("dropped") or {}).values())),
        ("rejected", sum((counts.get("rejected") or {}).values())),
    ]


def _table(name: str, table: pa.Table) -> dict[str, Any]:
    shown = table.slice(0, LISTING_ROWS) if name in ("zero_trained", "untrained_eot") else table
    columns = [
        (f.name, "" if pa.types.is_integer(f.type) or pa.types.is_floating(f.type) else "s")
        for f in table.schema
    ]
    rows = [[_cell(v) for v in row.values()] for row in shown.to_pylist()]
    return {
        "name": name,
        "note": NOTES.get(name, ""),
        "columns": columns,
        "rows": rows,
        "more": table.num_rows - shown.num_rows,
    }


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, int) and not isinstance(value, bool):
        return (
            f"{value:,}"  # 13,674 reads at a glance; exact figures are in `etl stats --format csv`
        )
    return value


def _plot(title: str, caption: str, draw: Callable[..., None], *args: Any) -> dict[str, str]:
    buf = io.BytesIO()
    figure(title, draw, *args).savefig(buf, format="png")
    return {"title": title, "caption": caption, "png": base64.b64encode(buf.getvalue()).decode()}


def matplotlib_figure() -> Any:
    """matplotlib's `Figure` class (no pyplot: no global state, Agg canvas on savefig).

    Raises:
        EtlError: matplotlib is not installed (it is optional: only the report draws).
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise EtlError(
            "the report's plots need matplotlib: pip install 'etl[report]' (or matplotlib)"
        ) from exc
    return Figure


def figure(title: str, draw: Callable[..., None], *args: Any) -> Any:
    """A matplotlib Figure: `draw(ax, *args)`, the title, and the legend below the axes."""
    fig = matplotlib_figure()(figsize=(6.4, 3.8), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    draw(ax, *args)
    ax.set_title(title)
    handles, labels = ax.get_legend_handles_labels()
    if handles:  # below the axes, where it can cover no bar
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(handles), LEGEND_COLUMNS),
                   frameon=False)
    if not ax.has_data():
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, fontsize=14)
    return fig


def _draw_lengths(ax: Any, hist: pa.Table, seq_len: int | None) -> None:
    from matplotlib.ticker import MaxNLocator
    rows = hist.to_pydict()
    for i, split in enumerate(sorted(set(rows["split"]))):
        idx = [k for k, s in enumerate(rows["split"]) if s == split]
        starts = [rows["bin_start"][k] for k in idx]
        width = rows["bin_end"][idx[0]] - starts[0]
        ax.bar(
            starts,
            [rows["examples"][k] for k in idx],
            width=width,
            align="edge",
            alpha=0.6,
            color=COLORS[i % len(COLORS)],
            label=split,
        )
    ax.set_xlabel("tokens per example")
    ax.set_ylabel("examples")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if not hist.num_rows:
        return
    right = max(rows["bin_end"])
    ax.set_xlim(0, right * X_MARGIN)
    if seq_len and seq_len <= right * X_MARGIN:
        ax.axvline(seq_len, color="#444", linestyle="--", linewidth=1)
    elif seq_len:  # named in the label: a mark inside the axes could cover a bar
        ax.set_xlabel(f"tokens per example (seq_len {seq_len:,} lies beyond the right edge)")


def _draw_roles(ax: Any, roles: pa.Table) -> None:
    r = roles.to_pydict()
    if not roles.num_rows:
        return
    trained = r["trained_tokens"]
    untrained = [k - t for k, t in zip(r["kept_tokens"], trained)]
    ax.bar(r["role"], trained, color=COLORS[2], label="trained")
    ax.bar(r["role"], untrained, bottom=trained, color=COLORS[0], label="kept, not trained")
    ax.bar(
        r["role"],
        r["dropped_tokens"],
        bottom=r["kept_tokens"],
        color=COLORS[3],
        label="dropped turns",
    )
    tops = [k + d for k, d in zip(r["kept_tokens"], r["dropped_tokens"])]
    for x, (share, top) in enumerate(zip(r["trained_share"], tops)):
        if share:  # the figure people look for: what fraction of each role carries loss
            ax.annotate(f"{share:.0%} trained", (x, top), ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("tokens")
    ax.set_ylim(0, max(max(tops) * 1.15, 1))


def _draw_turns(ax: Any, turns: pa.Table) -> None:
    r = turns.to_pydict()
    splits = sorted(set(r["split"]))
    width = 0.8 / max(len(splits), 1)
    for i, split in enumerate(splits):
        idx = [k for k, s in enumerate(r["split"]) if s == split]
        xs = [r["num_turns"][k] + (i - (len(splits) - 1) / 2) * width for k in idx]
        lost = [r["examples_with_dropped_turns"][k] for k in idx]
        whole = [r["examples"][k] - n for k, n in zip(idx, lost)]
        color = COLORS[i % len(COLORS)]
        ax.bar(xs, whole, width=width, color=color, label=split)
        ax.bar(
            xs,
            lost,
            bottom=whole,
            width=width,
            color=color,
            alpha=0.5,
            hatch="//",
            label=f"{split}: lost turns",
        )
    ax.set_xlabel("turns per conversation")
    ax.set_ylabel("examples")


def _draw_drops(ax: Any, drops: pa.Table) -> None:
    r = drops.to_pydict()
    labels, values, colors = [], [], []
    palette = {
        "written": COLORS[2],
        "truncated": COLORS[1],
        "dropped": COLORS[3],
        "rejected": COLORS[4],
    }
    for stage, reason, n in zip(r["stage"], r["reason"], r["manifest"]):
        if stage in palette and n is not None:
            labels.append(f"{stage}: {reason}" if reason else stage)
            values.append(n)
            colors.append(palette[stage])
    if not values:
        return
    ax.barh(labels[::-1], values[::-1], color=colors[::-1])
    ax.set_xlabel("examples (input records)")
