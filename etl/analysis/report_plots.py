"""The plots of `etl report`: matplotlib figures (Agg canvas, no pyplot state) saved as PNG.

Each `draw_*` function fills one Axes from one `sql/` query's table; `figure` adds the title and
the legend, `plots` makes the report's four (five for a mixture run; four more for an image run's
output, `image_plots`), in page order, as base64 PNGs.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from etl.errors import EtlError

COLORS = ("#3b75af", "#ef8636", "#519e3e", "#c53a32", "#8d69b8", "#84584e")
# Legend entries per row below a plot: four short labels fit the 6.4-inch figure.
LEGEND_COLUMNS = 4
X_MARGIN = 1.02  # the length axis ends just past the last bin (matplotlib's default margin is 5%)
MIXTURE_TITLE = "Mixture: requested vs realised share"  # also the image's alt text on the page
TILT_ABOVE = 6  # bar labels tilt beyond this many: wider ones overlap on the 6.4-inch figure
MIN_SLOTS = 4  # a plot of one or two bins keeps room for four: one bar would fill the axes


def plots(results: dict[str, pa.Table], seq_len: int | None) -> list[dict[str, str]]:
    """The report's plots from the `run_queries` results: title, caption and base64 PNG each.

    The mixture plot comes only for a mixture run (the `mixture` query has rows only then).
    """
    figures = [
        plot_png(
            "Example lengths",
            "Examples per length bin, per split, over the data's range; dashed: seq_len "
            "(named under the axis when it lies beyond).",
            draw_lengths,
            results["length_histogram"],
            seq_len,
        ),
        plot_png(
            "Tokens by role (trained share)",
            "Kept tokens per role, trained or not, and tokens of dropped turns.",
            draw_roles,
            results["roles"],
        ),
        plot_png(
            "Turns per example",
            "Turns per conversation (dropped ones included), per split; "
            "hatched: examples that lost turns to truncation.",
            draw_turns,
            results["turns_per_example"],
        ),
        plot_png(
            "Where examples went",
            "Manifest counts: written, truncated, dropped and rejected.",
            draw_drops,
            results["drops"],
        ),
    ]
    figures += image_plots(results)
    mixture = results.get("mixture")
    if mixture is not None and mixture.num_rows:
        figures.append(
            plot_png(
                MIXTURE_TITLE,
                "Each source's share of the mixed data, asked for and recounted from the data "
                "(unit: the run's mix_by); over each pair: realised - requested, in points.",
                draw_mixture,
                mixture,
            )
        )
    return figures


def image_plots(results: dict[str, pa.Table]) -> list[dict[str, str]]:
    """An image run's plots: images per example, image-token share, long sides, tokens per image
    ([] for a text run's output: its results have no image queries)."""
    if "images_per_example" not in results:
        return []
    per_example, share = results["images_per_example"], results["image_share_histogram"]
    sizes, tokens = results["image_sizes"], results["image_tokens"]
    counts = [str(n) for n in per_example.column("images").to_pylist()]
    shares = _ranges(share, "percent_from", "percent_to", "{a}–{b}%")
    return [
        plot_png("Images per example", "Examples per number of images, per split.",
                 draw_split_bars, per_example, counts, "examples", "images per example"),
        plot_png("Image-token share per example", "Examples with images per share of their tokens "
                 "that are image tokens (num_image_tokens / num_tokens), per split.",
                 draw_split_bars, share, shares, "examples", "image tokens, share of the example"),
        plot_png("Image sizes (long side)", "Images per long side in pixels, as load_image sees "
                 "each image (power-of-two bins), per split.", draw_split_bars, sizes,
                 _ranges(sizes, "long_side_from", "long_side_to"), "images", "long side (pixels)"),
        plot_png("Tokens per image", "Images per token count (t*h*w / merge_size², power-of-two "
                 "bins), per split.", draw_split_bars, tokens,
                 _ranges(tokens, "tokens_from", "tokens_to"), "images", "tokens per image"),
    ]


def _ranges(table: pa.Table, start: str, end: str, form: str = "{a:,}–{z:,}") -> list[str]:
    """Each row's bin [start, end) as a bar label: `z` is its last integer (256–511)."""
    ends = table.column(end).to_pylist()
    return [form.format(a=a, b=b, z=b - 1) for a, b in zip(table.column(start).to_pylist(), ends)]


def plot_png(title: str, caption: str, draw: Callable[..., None], *args: Any) -> dict[str, str]:
    """The figure as a base64 PNG with its title and caption, as the page embeds it."""
    buf = io.BytesIO()
    figure(title, draw, *args).savefig(buf, format="png")
    return {"title": title, "caption": caption, "png": base64.b64encode(buf.getvalue()).decode()}


def matplotlib_figure() -> Any:
    """matplotlib's `Figure` class (no pyplot: no global state, Agg canvas on savefig).

    Raises:
        EtlError: matplotlib is not installed (it is optional: only the report draws).
    """
    try:
        # matplotlib (docs/design.md, Measured costs): only when a plot is drawn
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


def draw_lengths(ax: Any, hist: pa.Table, seq_len: int | None) -> None:
    """Examples per length bin, a colour per split; seq_len dashed inside the axis, else named."""
    # matplotlib (docs/design.md, Measured costs): only when a plot is drawn
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
    mark_seq_len(ax, max(rows["bin_end"]), seq_len, "tokens per example")


def mark_seq_len(ax: Any, right: float, seq_len: int | None, label: str) -> None:
    """End the length axis just past `right`; a dashed line at seq_len when it lies inside, else
    seq_len named in the axis label (`label`): a mark inside the axes could cover a bar."""
    ax.set_xlim(0, right * X_MARGIN)
    if seq_len and seq_len <= right * X_MARGIN:
        ax.axvline(seq_len, color="#444", linestyle="--", linewidth=1)
    elif seq_len:
        ax.set_xlabel(f"{label} (seq_len {seq_len:,} lies beyond the right edge)")


def draw_roles(ax: Any, roles: pa.Table) -> None:
    """Tokens per role, stacked: trained, kept but not trained, dropped turns; share on top."""
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


def draw_turns(ax: Any, turns: pa.Table) -> None:
    """Examples per turn count, splits side by side; hatched: examples that lost turns."""
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


def draw_drops(ax: Any, drops: pa.Table) -> None:
    """The manifest's counts per stage and reason, as horizontal bars."""
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


def draw_mixture(ax: Any, mixture: pa.Table) -> None:
    """Requested and realised share per source, side by side; realised - requested on top."""
    r = mixture.to_pydict()
    if not mixture.num_rows:
        return
    xs = range(mixture.num_rows)
    requested = [v or 0.0 for v in r["requested_share"]]
    realised = [v or 0.0 for v in r["realised_share"]]
    width = 0.4
    ax.bar([x - width / 2 for x in xs], requested, width=width, color=COLORS[0], label="requested")
    ax.bar([x + width / 2 for x in xs], realised, width=width, color=COLORS[1], label="realised")
    for x, diff, top in zip(xs, r["difference"], map(max, requested, realised)):
        if diff is not None:  # the figure people look for: how far the mix landed from the ask
            ax.annotate(f"{diff * 100:+.1f} pp", (x, top), ha="center", va="bottom", fontsize=9)
    tilt = mixture.num_rows > 5  # beyond ~5 sources, level names overlap on the 6.4-inch figure
    ax.set_xticks(
        list(xs), r["source"], rotation=30 if tilt else 0, ha="right" if tilt else "center"
    )
    ax.set_ylabel(f"share of {r['mix_by'][0]}")
    ax.set_ylim(0, max(max(requested + realised) * 1.15, 0.05))


def draw_split_bars(ax: Any, table: pa.Table, labels: list[str], count: str, xlabel: str) -> None:
    """Bars of `count` per row label (a bin; every split has the same bins, in order), splits side
    by side, as `draw_turns` draws turn counts."""
    # matplotlib (docs/design.md, Measured costs): only when a plot is drawn
    from matplotlib.ticker import MaxNLocator

    r = table.to_pydict()
    order = list(dict.fromkeys(labels))
    splits = sorted(set(r["split"]))
    width = 0.8 / max(len(splits), 1)
    for i, split in enumerate(splits):
        idx = [k for k, s in enumerate(r["split"]) if s == split]
        xs = [order.index(labels[k]) + (i - (len(splits) - 1) / 2) * width for k in idx]
        ax.bar(xs, [r[count][k] for k in idx], width=width, color=COLORS[i % len(COLORS)], label=split)
    tilt, half = len(order) > TILT_ABOVE, max(len(order), MIN_SLOTS) / 2
    ax.set_xlim((len(order) - 1) / 2 - half, (len(order) - 1) / 2 + half)
    ax.set_xticks(range(len(order)), order, rotation=30 if tilt else 0, ha="right" if tilt else "center")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(count)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
