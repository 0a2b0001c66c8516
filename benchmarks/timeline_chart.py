"""Draw a rolling restart's health timeline: each host's /health, sampled every 0.5 s during a
plain `pyinfra INVENTORY deploys/serve.py` config change, as one row per host (up / down). The
samples are the recorded live run the fast tier replays (tests/unit/data/replays/rolling_timeline,
with its provenance); the manual shows the picture (docs/guides/rollout.md).

Usage: python benchmarks/timeline_chart.py [REPLAY_DIR] [OUT_PNG]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from specdeploy.report.charts import SMALLEST_PT, WIDTH_IN, save  # one chart style
from tests.timeline import Timeline  # the judge the live test and the replay use

REPO = Path(__file__).resolve().parents[1]

REPLAY = REPO / "tests/unit/data/replays/rolling_timeline"
OUT = REPO / "docs/assets/rolling-timeline.png"


def draw(replay: Path, out: Path) -> None:
    raw = {p.stem: p.read_text() for p in sorted((replay / "timeline").glob("*.txt"))}
    timeline = Timeline(raw)
    provenance = json.loads((replay / "provenance.json").read_text())
    start = min(samples[0][0] for samples in timeline.samples.values())
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 1.2 + 0.6 * len(raw)))
    for row, (host, samples) in enumerate(timeline.samples.items()):
        for (t, up), (t_next, _) in zip(samples, samples[1:], strict=False):
            ax.barh(row, t_next - t, left=t - start, color="tab:green" if up else "tab:red")
        down = timeline.down_seconds(host)
        label = f"down {down:.0f} s"
        ax.text(samples[-1][0] - start + 1, row, label, va="center", fontsize=SMALLEST_PT)
    ax.set_yticks(range(len(raw)), list(raw))
    ax.invert_yaxis()
    ax.set_xlabel("seconds (each host's /health every 0.5 s; green 200, red not)")
    both = timeline.all_down()
    ax.set_title(
        f"rolling restart, one host at a time: all hosts down at {len(both)} sampled instants "
        f"(commit {provenance['commit'][:7]}, {provenance['recorded_at'][:10]})",
        fontsize=9,
    )
    save(fig, out)


if __name__ == "__main__":
    draw(
        Path(sys.argv[1]) if len(sys.argv) > 1 else REPLAY,
        Path(sys.argv[2]) if len(sys.argv) > 2 else OUT,
    )
