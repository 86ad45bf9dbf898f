"""`etl report`: the HTML is self-contained and its PNG plots decode to real, non-blank images."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import numpy as np
import pytest

from etl.analysis.report import TABLES, build_report, write_report
from etl.analysis.report_plots import COLORS
from etl.errors import EtlError
from tests.analysis.stats_fixtures import REPO

PNG = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def decode(html: str) -> list[np.ndarray]:
    """Every embedded plot as an RGB float array, decoded by matplotlib's PNG reader."""
    import matplotlib.image as mpimg

    return [
        mpimg.imread(io.BytesIO(base64.b64decode(b64)), format="png")[..., :3]
        for b64 in PNG.findall(html)
    ]


def share_of_color(image: np.ndarray, hex_color: str) -> float:
    rgb = np.array([int(hex_color[i : i + 2], 16) for i in (1, 3, 5)]) / 255
    return float((np.abs(image - rgb).max(axis=-1) < 0.02).mean())


def assert_not_blank(image: np.ndarray) -> None:
    assert image.shape[0] > 200 and image.shape[1] > 300
    assert (image < 0.9).any(axis=-1).mean() > 0.01  # axes, ticks, text, bars
    assert len(np.unique((image * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 20


def test_report_plots_decode_and_show_the_data(dst: Path, tmp_path: Path) -> None:
    out = write_report(dst, tmp_path / "sub" / "report.html")
    html = out.read_text(encoding="utf-8")
    images = decode(html)
    assert len(images) == 4
    for image in images:
        assert_not_blank(image)
    lengths, roles, _turns, drops = images
    assert share_of_color(roles, COLORS[2]) > 0.01  # trained tokens bar (assistant)
    assert share_of_color(roles, COLORS[0]) > 0.05  # untrained kept tokens (system, user)
    assert share_of_color(drops, COLORS[3]) > 0.005  # dropped reasons
    assert share_of_color(drops, COLORS[4]) > 0.005  # rejected reasons
    assert share_of_color(lengths, "#ffffff") < 0.97


def test_report_is_self_contained_and_has_the_tables(dst: Path) -> None:
    html = build_report(dst, title="fixture <report>")
    assert "<title>fixture &lt;report&gt;</title>" in html  # autoescaped
    assert not re.search(r'(src|href)="(https?:)?//', html)
    assert "<script" not in html and "<link" not in html
    for name in TABLES:
        assert f'<h2 id="{name}">' in html
    for figure in ("invalid_json", "bad_role", "ex-chat-1", "ex-code-2", "accounting_gap"):
        assert figure in html


def test_report_of_an_empty_output_still_renders(empty_dst: Path) -> None:
    html = build_report(empty_dst)
    images = decode(html)
    assert len(images) == 4
    for image in images:
        assert_not_blank(image)
    assert "(no rows)" in html


def test_report_refuses_a_folder_as_output(dst: Path, tmp_path: Path) -> None:
    with pytest.raises(EtlError, match="is a folder"):
        write_report(dst, tmp_path)


def overlaps(a: object, b: object) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["roles", "turns_per_example"])
def test_report_legends_sit_below_the_axes(any_dst: Path, name: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from etl.analysis.report_plots import draw_roles, draw_turns, figure
    from etl.analysis.stats import run_query

    draw = {"roles": draw_roles, "turns_per_example": draw_turns}[name]
    fig = figure(name, draw, run_query(any_dst, name))
    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # runs the constrained layout, so the extents are final
    renderer = canvas.get_renderer()
    (ax,) = fig.axes
    assert ax.get_legend() is None and len(fig.legends) == 1
    assert not overlaps(fig.legends[0].get_window_extent(renderer), ax.get_window_extent(renderer))


def test_report_length_axis_spans_the_data_not_seq_len(tmp_path: Path, cli: object) -> None:
    import pyarrow as pa

    from etl.analysis.report import histogram_bin_width
    from etl.analysis.report_plots import X_MARGIN, draw_lengths, figure

    out = tmp_path / "out"
    assert cli("run", str(REPO / "examples" / "raw"), str(out), "--quiet").returncode == 0  # type: ignore[operator]
    assert histogram_bin_width(out) < 2048 // 32  # bins fitted to the data, not to S = 2048
    hist = pa.table({"split": ["train"] * 3, "bin_start": [0, 10, 20], "bin_end": [10, 20, 30],
                     "examples": [1, 4, 2]})
    ax = figure("lengths", draw_lengths, hist, 2048).axes[0]
    assert ax.get_xlim() == (0, 30 * X_MARGIN) and "seq_len 2,048" in ax.get_xlabel()
    ax = figure("lengths", draw_lengths, hist, 25).axes[0]
    assert [line.get_xdata()[0] for line in ax.get_lines()] == [25] and "seq_len" not in ax.get_xlabel()
