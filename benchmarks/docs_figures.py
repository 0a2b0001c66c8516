"""Draw the manual's figures (docs/assets/*.png) from the recordings they show, with the code that
draws them for a user: a compare and a tune report are rebuilt by the product's report
(specdeploy/report/summary.write, which draws report/charts.py's charts) from the raw files of the
replays the live tier recorded; the H200 load chart is report/charts.load_chart over the recorded
proof's summary; the live verdict over time is report/charts.live_chart over the verdict wing's
recorded judge; the payoff map and the rolling-restart timeline come from their own scripts, which
draw with the report's style (charts.save). Every figure is sized for the manual's column:
tests/unit/project/test_docs_figures.py checks each.

Usage: python benchmarks/docs_figures.py [NAME...]     (from the repo root; no NAME: all of them)
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks import timeline_chart
from benchmarks.gpu_payoff import analyze
from specdeploy.report import summary
from specdeploy.report.charts import live_chart, load_chart

REPO = Path(__file__).resolve().parents[1]

ASSETS = REPO / "docs/assets"
REPLAYS = REPO / "tests/unit/data/replays"


def report_charts(replay: str, charts: dict[str, str]) -> None:
    """Rebuild the replay's report in a scratch run directory named as the recorded run, and copy
    its charts (report name -> docs name)."""
    source = REPLAYS / replay
    run = json.loads((source / "summary.json").read_text())["run"]
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = Path(scratch) / run
        shutil.copytree(source / "raw", run_dir / "raw")
        written = summary.write(run_dir)["charts"]
        for chart, name in charts.items():
            assert chart in written, (replay, chart, written)
            shutil.copyfile(run_dir / chart, ASSETS / name)


def compare() -> None:
    report_charts(
        "trained_compare",
        {
            "latency.png": "compare-latency.png",
            "ratios.png": "compare-ratios.png",
            "acceptance.png": "compare-acceptance.png",
        },
    )


def tune() -> None:
    report_charts("trained_tune", {"tune_tpot.png": "tune-tpot.png"})


def draft() -> None:
    report_charts("trained_choose_draft", {"draft_tpot.png": "draft-tpot.png"})


def h200_load() -> None:
    recording = REPO / "benchmarks/gpu_load/h200-0.26.0-5starts/summary.json"
    proof = json.loads(recording.read_text())["proof"]
    with tempfile.TemporaryDirectory() as scratch:
        (name,) = load_chart(proof, Path(scratch))
        shutil.copyfile(Path(scratch) / name, ASSETS / "h200-load-ratio.png")


def h200_payoff() -> None:
    png = REPO / "benchmarks/gpu_payoff/payoff.png"  # the benchmark's report shows it too
    with contextlib.redirect_stdout(io.StringIO()):  # the REPORT tables, printed again
        analyze.report(str(REPO / "benchmarks/gpu_payoff/results.json"), str(png))
    shutil.copyfile(png, ASSETS / "h200-payoff.png")


def rolling_timeline() -> None:
    timeline_chart.draw(timeline_chart.REPLAY, ASSETS / "rolling-timeline.png")


def live_verdict() -> None:
    """The live wing's judge over both phases: the trained set, then the probe's slowest traffic."""
    replay = REPLAYS / "live_verdict"
    state = json.loads((replay / "live-verdict.json").read_text())
    phases = json.loads((replay / "phases.json").read_text())
    marks = {
        f"phase 1: {phases['phase1_traffic']}": state["snapshots"][0]["t"],
        f"phase 2: {phases['phase2_traffic']}": phases["phase2_start"],
    }
    live_chart(state, ASSETS / "live-verdict.png", marks=marks)


FIGURES = {
    "compare": compare,
    "tune": tune,
    "draft": draft,
    "h200-load": h200_load,
    "h200-payoff": h200_payoff,
    "rolling-timeline": rolling_timeline,
    "live-verdict": live_verdict,
}


if __name__ == "__main__":
    for figure in sys.argv[1:] or FIGURES:
        FIGURES[figure]()
        print(f"drew {figure}")
