"""Every figure of the manual, and every chart a report draws, can be read where it is shown.

The rule. The manual's text column is about 800 CSS px wide (mkdocs-material beside its
navigation); an image is shown at its own width when narrower, and scaled down to the column when
wider (Material's `max-width: 100%`). A text of s pt drawn at d dpi is s * d / 72 px tall in the
image, so on the page it is

    s * d / 72 * min(1, 800 / image width)   px.

The smallest text of every figure must come out at 10 px or more there: the manual's body text is
16 px, and below ~10 px screen text stops being readable at a glance. (The strip of five panels
this replaces had 7 pt at 110 dpi on 2200 px: 3.9 px.) Nothing is guessed from pixels: the report's
`charts.save` writes the smallest text size it drew into the PNG (`SMALLEST_TEXT_KEY`) beside the
dpi, and a figure without it fails (draw it through `charts.save`; `python benchmarks/
docs_figures.py` redraws the manual's from their recordings).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specdeploy.report import summary
from specdeploy.report.charts import SMALLEST_TEXT_KEY, load_chart
from tests.tools import need_module
from tests.unit import REPO

FIGURES = sorted((REPO / "docs").rglob("*.png"))
REPLAYS = REPO / "tests/unit/data/replays"
COLUMN_PX = 800  # the manual's text column
SMALLEST_PX = 10  # the smallest text on the page


def shown_text_px(png: Path) -> tuple[float, str]:
    """The smallest text's size on the page, in CSS px, and how it was reckoned."""
    image_module = need_module("PIL.Image", "Pillow, a dependency of matplotlib")
    with image_module.open(png) as image:
        width = image.size[0]
        dpi = image.info.get("dpi", (72, 72))[0]
        smallest = image.info.get(SMALLEST_TEXT_KEY)
    assert smallest is not None, (
        f"{png.name}: no {SMALLEST_TEXT_KEY} in the PNG: draw it with "
        "specdeploy.report.charts.save (benchmarks/docs_figures.py redraws the manual's figures)"
    )
    scale = min(1.0, COLUMN_PX / width)
    px = float(smallest) * dpi / 72 * scale
    return px, f"{smallest} pt at {dpi:.0f} dpi, {width} px wide shown at {scale:.2f}: {px:.1f} px"


def test_the_rule_fails_the_old_strip_of_five_panels():
    """The 2200 px strip had 7 pt at 110 dpi: 3.9 px on the page; the 880 px grid's 8 pt: 11.1."""
    assert 7 * 110 / 72 * COLUMN_PX / 2200 < SMALLEST_PX <= 8 * 110 / 72 * COLUMN_PX / 880


@pytest.mark.parametrize("png", FIGURES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_figure_of_the_manual_is_legible_in_its_column(png):
    px, reckoned = shown_text_px(png)
    assert px >= SMALLEST_PX, f"{png.name}: smallest text {reckoned} < {SMALLEST_PX} px"


def test_every_figure_of_the_manual_is_shown_by_a_page():
    pages = "\n".join(p.read_text() for p in (REPO / "docs").rglob("*.md"))
    assert FIGURES and all(f"assets/{png.name}" in pages for png in FIGURES)


@pytest.fixture(scope="module")
def report_charts(tmp_path_factory) -> list[Path]:
    """The charts the product's report draws from the recorded compare, tune and load runs."""
    charts = []
    for replay in ("trained_compare", "trained_tune", "trained_choose_draft"):
        run_dir = tmp_path_factory.mktemp(replay)
        shutil.copytree(REPLAYS / replay / "raw", run_dir / "raw")
        charts += [run_dir / name for name in summary.write(run_dir)["charts"]]
    recording = REPO / "benchmarks/gpu_load/h200-0.26.0-5starts/summary.json"
    run_dir = tmp_path_factory.mktemp("load")
    charts += [run_dir / n for n in load_chart(json.loads(recording.read_text())["proof"], run_dir)]
    return charts


def test_every_chart_a_report_draws_is_legible_in_a_column(report_charts):
    names = {png.name for png in report_charts}
    assert names == {"latency.png", "ratios.png", "acceptance.png", "tune_tpot.png",
                     "load_ratio.png", "draft_tpot.png"}  # fmt: skip
    for png in report_charts:
        px, reckoned = shown_text_px(png)
        assert px >= SMALLEST_PX, f"{png.name}: smallest text {reckoned} < {SMALLEST_PX} px"


# --- the tune chart draws what its legend says -------------------------------------------------


@pytest.fixture
def drawn(monkeypatch):
    """The figures the report's charts hand to `save`, kept open for inspection."""
    from specdeploy.report import charts

    figures = []
    real = charts.save

    def keep(fig, path, rect=(0, 0, 1, 1)):
        figures.append((Path(path).name, fig, [t.get_text() for t in fig.findobj(_text())]))
        return real(fig, path, rect)

    monkeypatch.setattr(charts, "save", keep)
    return figures


def _text():
    from matplotlib.text import Text

    return Text


def _tune_axes(figures):
    ((_, fig, texts),) = [f for f in figures if f[0] == "tune_tpot.png"]
    (ax,) = fig.axes
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    stars = [line for line in ax.lines if line.get_marker() == "*"]
    xs = {round(float(x)) for c in ax.collections for x, _ in c.get_offsets()}
    return ax, legend, stars, xs, " ".join(texts)


def test_the_tune_chart_draws_every_run_and_no_star_when_speculation_stays_off(drawn, tmp_path):
    """The recorded tune (predict flow, poor draft): the pin run of k = 2, the confirmed k = 4, the
    baseline at k = 0, k = 3 predicted only; the rule leaves speculation off, so no star is drawn
    and no text speaks of one."""
    shutil.copytree(REPLAYS / "trained_tune" / "raw", tmp_path / "raw")
    summary.write(tmp_path)
    ax, legend, stars, xs, texts = _tune_axes(drawn)
    assert not stars and "star" not in texts and "recommended k" not in legend
    assert xs == {0, 2, 4}  # every measured run, the baseline's at 0
    assert "predicted, not measured" in legend and "baseline median" in legend
    assert any("speculation off" in label for label in legend)


def test_the_tune_chart_stars_the_recommended_k(drawn, tmp_path):
    from specdeploy.report.charts import tune_charts

    values = {0: [8.0, 8.2, 8.1], 1: [6.0, 6.2, 6.1], 2: [5.1, 5.3, 5.2]}
    per_k = {str(k): {"median": v[1], "mad": 0.1} for k, v in values.items() if k}
    host = {
        "choice": {"per_k": per_k, "recommended_k": 2,
                   "baseline": {"median": 8.1, "values": values[0]}},
        "per_k": {str(k): {"arms": {"tpot": {"values": v}}} for k, v in values.items() if k},
    }  # fmt: skip
    tune_charts({"hosts": {"h1": host}}, tmp_path)
    ax, legend, stars, xs, _ = _tune_axes(drawn)
    ((star,),) = [line.get_xydata() for line in stars]
    assert tuple(star) == (2, 5.3) and "recommended k" in legend and xs == {0, 1, 2}
    assert "predicted, not measured" not in legend  # nothing predicted: not in the legend
