"""`etl report`: one self-contained HTML page of an etl output's statistics.

Figures come from the `sql/` queries (`etl.analysis.stats`); plots are matplotlib PNGs
(`etl.analysis.report_plots`; for preference and unpaired outputs `etl.analysis.pair_report`)
embedded as base64, so the page opens anywhere with no network and no extra files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa

from etl.analysis import pair_report
from etl.analysis.pair_stats import output_kind
from etl.analysis.report_plots import matplotlib_figure, plots
from etl.analysis.stats import (
    IMAGE_QUERIES,
    QUERY_ORDER,
    default_bin_width,
    image_block,
    query_names,
    run_queries,
    run_query,
)
from etl.errors import EtlError
from etl.kinds import KINDS
from etl.output.manifest import read_manifest

# Tables shown under the plots, in `etl stats` order; the histogram and turns-per-example
# queries are shown as plots only. Row listings show their first rows (they can be long).
PLOTTED_ONLY = ("length_histogram", "turns_per_example")
TABLES = tuple(name for name in QUERY_ORDER if name not in PLOTTED_ONLY + IMAGE_QUERIES)
# An image run's output adds these tables (its other image queries are shown as plots only): the
# totals, and the sizes' bins with their mean sizes and token costs, which the plot leaves out.
IMAGE_TABLES = ("images", "image_sizes")
LISTING_ROWS = 20

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
    "mixture": "Mixture runs only (no rows otherwise): each source's examples, up-sampled "
    "copies (ids ending #k) and tokens in the data; realised_share is recounted from the data "
    "in the run's mix_by unit, manifest_realised_share is the run's own figure.",
    "drops": "Manifest counts against what the Parquet shows; accounting_gap must be 0.",
    "rejects": "Input rows that could not be used, with the first one per reason.",
    "packing": "Sequences of seq_len needed padded (one example each) versus packed; "
    "packed_lower_bound is a bound, first-fit-decreasing lands at or slightly above.",
    "consistency": "Rules of the output layout; each count should be 0 (first_id: one to inspect).",
    "zero_trained": "Examples with no trained token (etl run drops these: expected empty).",
    "untrained_eot": "Trained assistant turns whose end-of-turn token carries no loss "
    "(expected when end-of-turn training is none/last).",
    "images": "Images and their tokens (image runs); image_tokens_in_grids recounts image tokens "
    "from the grids (t*h*w / merge_size²): it must equal image_tokens.",
    "image_sizes": "Images per long side (power-of-two bins), with their mean size and the tokens "
    "they cost.",
}


def build_report(dst: str | os.PathLike[str], *, title: str | None = None) -> str:
    """Render the HTML page of an etl output.

    Args:
        dst: the output folder of `etl run`.
        title: page title; "etl report: <dst>" when None.

    Returns:
        The HTML text, with every plot embedded.
    """
    # jinja2: only when the HTML report is rendered
    import jinja2

    matplotlib_figure()  # before any query: a missing optional dependency fails in milliseconds
    manifest = read_manifest(dst)
    kind = output_kind(manifest)
    results = run_queries(dst, bin_width=histogram_bin_width(dst))
    facts = _facts(dst, manifest)
    if not KINDS[kind].pair:
        figures, notes = plots(results, manifest.get("seq_len")), NOTES
        tables = tuple(name for name in results if name in TABLES + IMAGE_TABLES)
    else:  # a preference or unpaired output: its own plots, tables and facts
        figures = pair_report.pair_plots(results, manifest.get("seq_len"), kind)
        tables = tuple(n for n in query_names(kind) if n not in pair_report.PLOTTED_ONLY)
        notes, facts = pair_report.NOTES, facts + pair_report.pair_facts(manifest, kind)
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    return env.from_string(PAGE).render(
        title=title or f"etl report: {dst}",
        facts=facts,
        plots=figures,
        tables=[_table(name, results[name], notes) for name in tables],
        zip=zip,
    )


def histogram_bin_width(dst: str | os.PathLike[str]) -> int:
    """Length-histogram bins fitted to the longest example, not to seq_len.

    Bins over 0..S would put short data under a long S (100-token chats, S = 32k) into the
    first bin or two; ~`etl.analysis.stats.HISTOGRAM_BINS` bins over the data's own range show its shape.
    A preference or unpaired output: over its longest prompt or completion (the parts drawn).
    """
    if not KINDS[output_kind(read_manifest(dst))].pair:
        longest = [v for v in run_query(dst, "lengths").column("max").to_pylist() if v is not None]
    else:
        rows = run_query(dst, "part_lengths").to_pylist()
        longest = [r["max"] for r in rows if r["part"] != "total" and r["max"] is not None]
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
        *_mixture_facts(manifest),
        *_image_facts(manifest),
    ]


def _mixture_facts(manifest: dict[str, Any]) -> list[tuple[str, Any]]:
    mixture = manifest.get("mixture")
    if not isinstance(mixture, dict):  # an ordinary run: no mixture lines at all
        return []
    names = ", ".join(str(s.get("name")) for s in mixture.get("sources") or [])
    return [
        ("mixture", f"{names} by {mixture.get('mix_by')} (seed {mixture.get('seed')})"),
        ("repeated", (manifest.get("counts") or {}).get("repeated")),
    ]


def _image_facts(manifest: dict[str, Any]) -> list[tuple[str, Any]]:
    """The image rule of an image run (none for a text run)."""
    block = image_block(manifest)
    if block is None:
        return []
    pixels = "–".join(str(_cell(block.get(k))) for k in ("min_pixels", "max_pixels"))
    rule = (f"{block.get('processor')}: patch {block.get('patch_size')}, merge "
            f"{block.get('merge_size')}, pixels {pixels} ({block.get('mode')})")
    return [("images", rule)]


def _table(name: str, table: pa.Table, notes: dict[str, str]) -> dict[str, Any]:
    shown = table.slice(0, LISTING_ROWS) if name in ("zero_trained", "untrained_eot") else table
    columns = [
        (f.name, "" if pa.types.is_integer(f.type) or pa.types.is_floating(f.type) else "s")
        for f in table.schema
    ]
    rows = [[_cell(v) for v in row.values()] for row in shown.to_pylist()]
    return {
        "name": name,
        "note": notes.get(name, ""),
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
