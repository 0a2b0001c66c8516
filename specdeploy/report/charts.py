"""The charts of a compare or tune report (matplotlib, Agg): PNGs beside summary.md.

Every chart is drawn to be read where a report or the manual shows it, a column about 800 px wide:
at most `WIDTH_IN` wide at `DPI` (880 px, shown at 0.91), no text below `SMALLEST_PT`, so the
smallest text stays about 11 px on screen; a chart of many panels becomes a grid of two columns,
not a strip. `save` writes the smallest text size it drew into the PNG (`SMALLEST_TEXT_KEY`), so a
check of the image (tests/unit/project/test_docs_figures.py) reads it instead of guessing.
"""

from __future__ import annotations

import math
from pathlib import Path

from specdeploy.decide.decisions import METRICS

CHART_METRICS = ["ttft", "tpot", "itl", "e2el", "output_throughput"]
DPI = 110  # the reports' one resolution
WIDTH_IN = 8.0  # 880 px at DPI
SMALLEST_PT = 8  # the smallest text a chart draws: tick labels, legends, notes
SMALLEST_TEXT_KEY = "specdeploy:smallest_text_pt"  # PNG text chunk: the smallest text, in pt
COLORS = {"baseline": "#7f7f7f", "speculative": "#1f77b4"}
VERDICT_COLORS = {"better": "#2ca02c", "worse": "#d62728"}
# A verdict above its pair of bars, short enough for several hosts side by side in one panel.
SHORT_VERDICTS = {
    "no significant difference": "n.s.",
    "too few runs to decide at alpha": "too few runs",
    "too few hosts to decide at alpha": "too few hosts",
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def smallest_text_pt(fig) -> float:
    """The size of the smallest text the figure draws (visible, non-empty), in points."""
    from matplotlib.text import Text

    sizes = [
        t.get_fontsize()
        for t in fig.findobj(Text)
        if t.get_visible() and t.get_text().strip() and t.get_figure() is not None
    ]
    return min(sizes) if sizes else float("inf")


def save(fig, path: Path, rect=(0, 0, 1, 1)) -> Path:
    """Lay out, write `path` at DPI with the smallest text size it drew as PNG text, and free the
    figure. The one way the reports and the manual's figures are written."""
    plt = _plt()
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=DPI, metadata={SMALLEST_TEXT_KEY: f"{smallest_text_pt(fig):g}"})
    plt.close(fig)
    return Path(path)


def _save(fig, run_dir: Path, name: str, rect=(0, 0, 1, 1)) -> str:
    save(fig, Path(run_dir) / name, rect)
    return name


def _latency_grid(run: str, groups: list, run_dir: Path) -> str:
    """latency.png: one panel per metric in two columns (a strip of five is unreadable at a
    column's width), the last cell holding the legend and how to read the panels."""
    plt = _plt()
    rows = math.ceil((len(CHART_METRICS) + 1) / 2)
    fig, axes = plt.subplots(rows, 2, figsize=(WIDTH_IN, 0.6 + 2.9 * rows))
    cells = list(axes.flat)
    for ax, m in zip(cells, CHART_METRICS, strict=False):
        _, label, unit, lower = METRICS[m]
        for gi, (_gname, g) in enumerate(groups):
            for ai, arm in enumerate(("baseline", "speculative")):
                a = g["arms"][arm][m]
                x = gi + (ai - 0.5) * 0.38
                if a["median"] is None:
                    continue
                ax.bar(x, a["median"], width=0.36, color=COLORS[arm], yerr=a["mad"], capsize=4,
                       label=arm if gi == 0 and m == CHART_METRICS[0] else None)  # fmt: skip
                ax.scatter([x] * len(a["values"]), a["values"], color="black", s=10, zorder=3)
            v = g["ratios"][m]["verdict"]
            ax.text(gi, 1.02, SHORT_VERDICTS.get(v, v), ha="center", va="bottom",
                    fontsize=SMALLEST_PT, transform=ax.get_xaxis_transform(),
                    color=VERDICT_COLORS.get(v, "#555555"))  # fmt: skip
        ax.set_xticks(range(len(groups)), [g for g, _ in groups], fontsize=SMALLEST_PT,
                      rotation=20 if len(groups) > 2 else 0)  # fmt: skip
        ax.tick_params(axis="y", labelsize=SMALLEST_PT)
        ax.set_title(
            f"{label.split(' (')[0]} ({unit}), {'lower' if lower else 'higher'} is better\n",
            fontsize=9,
        )
    key = cells[len(CHART_METRICS)]
    key.axis("off")
    handles, labels = cells[0].get_legend_handles_labels()
    key.legend(handles, labels, loc="upper left", fontsize=9, frameon=False)
    key.text(0.0, 0.62, "bars: medians over runs\nerror bars: MAD\ndots: individual runs\n"
             "above each pair: the verdict\n(n.s.: no significant difference)\n"
             "prefix caching off", va="top", fontsize=9,
             transform=key.transAxes)  # fmt: skip
    for ax in cells[len(CHART_METRICS) + 1 :]:
        ax.axis("off")
    fig.suptitle(f"{run}: latency and throughput per arm", fontsize=10)
    return _save(fig, run_dir, "latency.png", rect=(0, 0, 1, 0.97))


def compare_charts(s: dict, run_dir: Path) -> list[str]:
    plt = _plt()
    written = []
    groups = list(s["hosts"].items()) + (
        [("fleet", s["fleet"])] if s["fleet"] and len(s["hosts"]) > 1 else []
    )
    if not groups:
        return written
    written.append(_latency_grid(s["run"], groups, run_dir))

    fig, ax = plt.subplots(figsize=(WIDTH_IN, 1.8 + 1.1 * len(groups)))
    LIMITS, ticks = (0.2, 5.0), []  # band edges beyond the axis are drawn at its edge
    for mi, m in enumerate(CHART_METRICS):
        for gi, (gname, g) in enumerate(groups):
            r = g["ratios"][m]
            if r["ratio"] is None:
                continue
            y = gi * (len(CHART_METRICS) + 1) + mi
            clip = lambda x: min(max(x, LIMITS[0]), LIMITS[1])  # noqa: E731
            hi = r["high"] if r["high"] is not None else LIMITS[1]
            color = VERDICT_COLORS.get(r["verdict"], "#7f7f7f")
            ax.plot([clip(r["low"]), clip(hi)], [y, y], color=color, lw=3, alpha=0.5)
            ax.plot([clip(r["ratio"])], [y], "o", color=color)
            ticks.append((y, f"{gname} {m}: {r['ratio']:.2f} ({r['verdict']})"))
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xscale("log")
    ax.set_xlim(*LIMITS)
    ax.set_xticks([0.25, 0.5, 1, 2, 4], ["0.25", "0.5", "1", "2", "4"])
    ax.minorticks_off()
    ax.set_yticks([t[0] for t in ticks], [t[1] for t in ticks], fontsize=SMALLEST_PT)
    ax.set_xlabel(
        "speculative / baseline (log scale, clipped to 0.2-5)\n"
        "latency < 1 is better, throughput > 1 is better",
        fontsize=9,
    )
    ax.set_title(
        "ratio of medians with its interval\ngreen better, red worse, grey: not decided at alpha",
        fontsize=9,
    )
    written.append(_save(fig, run_dir, "ratios.png"))

    apc = [(n, h["apc_profile"]) for n, h in s["hosts"].items() if h["apc_profile"]]
    if apc:
        fig, axes = plt.subplots(1, 3, figsize=(WIDTH_IN, 3.8))
        for ax, m in zip(axes, ["ttft", "e2el", "output_throughput"], strict=True):
            for gi, (_n, a) in enumerate(apc):
                for ai, arm in enumerate(("apc-off", "apc-on")):
                    v = a["arms"][arm][m]
                    if v["median"] is not None:
                        ax.bar(
                            gi + (ai - 0.5) * 0.38,
                            v["median"],
                            width=0.36,
                            yerr=v["mad"],
                            capsize=4,
                            color=["#7f7f7f", "#ff7f0e"][ai],
                            label=arm if gi == 0 and m == "ttft" else None,
                        )
            ax.set_xticks(range(len(apc)), [n for n, _ in apc], fontsize=SMALLEST_PT)
            ax.tick_params(axis="y", labelsize=SMALLEST_PT)
            ax.set_title(f"{METRICS[m][1].split(' (')[0]}\n({METRICS[m][2]})", fontsize=9)
        axes[0].legend(fontsize=SMALLEST_PT)
        fig.suptitle(
            "prefix-caching profile: APC off vs on\n(baseline server, shared-prefix requests)",
            fontsize=10,
        )
        written.append(_save(fig, run_dir, "apc.png"))
    return written


def tune_charts(s: dict, run_dir: Path) -> list[str]:
    """tune_tpot.png: TPOT by k with the baseline at k = 0; every run as a dot, the median and MAD
    bar of each k the rule compared, the baseline's median dashed, a k predicted but not measured
    (the predict flow) as a hollow diamond with its interval, and a star on the recommended k only
    when there is one. The legend names only what is drawn."""
    plt = _plt()
    if not s["hosts"]:
        return []
    fig, ax = plt.subplots(figsize=(7, 4.4))
    shown: set[str] = set()
    ticks: set[int] = {0}
    several = len(s["hosts"]) > 1

    def once(label: str) -> str | None:  # a legend entry per kind of mark, not per host
        if label in shown:
            return None
        shown.add(label)
        return label

    for hi, (name, h) in enumerate(s["hosts"].items()):
        color = f"C{hi}"
        choice = h["choice"]
        base = choice.get("baseline") or {}
        runs = {int(k): pk["arms"]["tpot"]["values"] for k, pk in h.get("per_k", {}).items()}
        runs[0] = base.get("values") or []
        for k, values in sorted(runs.items()):
            if values:
                ticks.add(k)
                ax.scatter([k] * len(values), values, s=14, color="black", alpha=0.55, zorder=3,
                           label=once("one run"))  # fmt: skip
        per_k = choice["per_k"]
        ks = sorted(int(k) for k in per_k)
        ticks |= set(ks)
        rk = choice["recommended_k"]
        verdict = f"recommended k = {rk}" if rk is not None else "speculation off"
        ax.errorbar(ks, [per_k[str(k)]["median"] for k in ks],
                    yerr=[per_k[str(k)]["mad"] for k in ks], marker="o", capsize=4, color=color,
                    label=f"{name + ': ' if several else ''}median per k compared, MAD bars "
                    f"({verdict})")  # fmt: skip
        if base.get("median") is not None:
            label = f"{name}: baseline median" if several else "baseline median"
            ax.axhline(base["median"], color=color, linestyle="--", linewidth=1, label=label)
        predicted = [
            row
            for row in ((h.get("predict_flow") or {}).get("rows") or [])
            if row.get("predicted_tpot_ms") is not None and not row.get("measured_runs")
        ]
        for row in predicted:
            k, y = row["k"], row["predicted_tpot_ms"]
            ticks.add(k)
            low, high = row.get("predicted_low") or y, row.get("predicted_high") or y
            ax.errorbar([k], [y], yerr=[[y - low], [high - y]], marker="D", mfc="white",
                        color=color, capsize=3, linestyle="none",
                        label=once("predicted, not measured"))  # fmt: skip
        if rk is not None:
            ax.plot([rk], [per_k[str(rk)]["median"]], "*", markersize=16, color="gold",
                    markeredgecolor="black", zorder=4, label=once("recommended k"))  # fmt: skip
    ax.set_xticks(sorted(ticks), [str(k) if k else "0\nbaseline" for k in sorted(ticks)])
    ax.tick_params(labelsize=SMALLEST_PT + 1)
    ax.set_xlabel("num_speculative_tokens (k)", fontsize=9)
    ax.set_ylabel("TPOT (ms)", fontsize=9)
    ax.set_title("TPOT by k: every run, and the median of each k the rule compared", fontsize=9)
    ax.legend(fontsize=SMALLEST_PT)
    ax.grid(alpha=0.3)
    return [_save(fig, run_dir, "tune_tpot.png")]


def acceptance_chart(curves: dict[str, list[float]], run_dir: Path, title: str) -> list[str]:
    """acceptance.png: one line per host (compare) or per k (tune), share of drafts whose i-th
    token was accepted, by draft position."""
    curves = {label: rates for label, rates in curves.items() if rates}
    if not curves:
        return []
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, rates in curves.items():
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=label)
    ax.set_xlabel("draft position")
    ax.set_ylabel("share of drafts accepted at this position")
    ax.set_ylim(0, 1)
    ax.set_xticks(range(1, max(len(r) for r in curves.values()) + 1))
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=SMALLEST_PT)
    ax.grid(alpha=0.3)
    return [_save(fig, run_dir, "acceptance.png")]


def acceptance_curves(s: dict, kind: str) -> dict[str, list[float]]:
    if kind == "compare":
        return {name: h["acceptance"].get("per_position") for name, h in s["hosts"].items()}
    return {
        f"{name} k={k}": pk["acceptance"].get("per_position")
        for name, h in s["hosts"].items()
        for k, pk in h["per_k"].items()
    }


def load_chart(s: dict, run_dir: Path) -> list[str]:
    """load_ratio.png: TPOT over the baseline's against concurrency, one line per k (tune) or per
    arm (the schedule, the fixed k: the proof), with each level's rank-test interval; below 1
    speculation pays at that load."""
    hosts = [(name, h) for name, h in s["hosts"].items() if h["ratios"]]
    if not hosts:
        return []
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    measured: set[int] = set()
    for name, h in hosts:
        for arm, by_level in h["ratios"].items():
            levels = sorted(by_level, key=int)
            points = [(int(c), by_level[c]) for c in levels if by_level[c]["ratio"] is not None]
            if not points:
                continue
            xs = [c for c, _ in points]
            measured |= set(xs)
            ys = [r["ratio"] for _, r in points]
            # an end the runs cannot bound is drawn as a zero-length bar, never invented
            low = [
                y - (r["low"] if r["low"] is not None else y)
                for y, (_, r) in zip(ys, points, strict=True)
            ]
            high = [
                (r["high"] if r["high"] is not None else y) - y
                for y, (_, r) in zip(ys, points, strict=True)
            ]
            label = arm if len(hosts) == 1 else f"{name} {arm}"
            ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=4, label=label,
                        linewidth=2.5 if arm in ("schedule", "speculative") else 1.2)  # fmt: skip
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(measured), [str(c) for c in sorted(measured)])
    ax.minorticks_off()
    ax.set_xlabel("concurrency (requests in flight: the batch size)")
    ax.set_ylabel("TPOT median / baseline's (interval per level)")
    ax.set_title(
        "speculative / baseline TPOT by load (below 1: speculation pays at that load)", fontsize=9
    )
    ax.legend(fontsize=SMALLEST_PT)
    ax.grid(alpha=0.3)
    return [_save(fig, run_dir, "load_ratio.png")]


LIVE_VERDICT_COLORS = {"pays": "#2ca02c", "loses": "#d62728", "undecided": "#7f7f7f"}


def live_chart(state: dict, path: Path, *, marks: dict[str, float] | None = None) -> Path:
    """The live verdict over time, from a judge's state (observe/live_verdict.py's
    live-verdict.json). Above: each arm's mean TPOT per window and the speculative arm's draft
    acceptance. Below: each usable window's paired ratio (speculative / baseline), every decision
    as a bar over its windows at its median ratio with its interval, coloured by verdict, the
    skipped windows, and the autopilot's rolls. `marks` ({label: epoch s}): vertical lines, such
    as where the traffic changed."""
    from specdeploy.decide import live_rule

    settings = state["settings"]
    windows = live_rule.windows_from_snapshots(
        state["snapshots"], min_requests=settings["min_requests"]
    )
    result = live_rule.live_decisions(
        windows, windows_per_decision=settings["windows_per_decision"], alpha=settings["alpha"]
    )
    t0 = state["snapshots"][0]["t"]

    def minutes(t: float) -> float:
        return (t - t0) / 60

    plt = _plt()
    fig, (top, low) = plt.subplots(2, 1, figsize=(WIDTH_IN, 6.2), sharex=True,
                                   gridspec_kw={"height_ratios": [1, 1.3]})  # fmt: skip
    mids = [minutes((w["start"] + w["end"]) / 2) for w in windows]
    for arm in live_rule.ARMS:
        tpot = [(x, w[arm]["tpot_mean_s"] * 1e3) for x, w in zip(mids, windows, strict=True)
                if w[arm]["tpot_mean_s"] is not None]  # fmt: skip
        if tpot:
            top.plot(*zip(*tpot, strict=True), marker="o", markersize=3, color=COLORS[arm],
                     label=f"{arm} TPOT")  # fmt: skip
    top.set_ylabel("mean TPOT per window (ms)")
    top.set_ylim(bottom=0)
    rate = top.twinx()
    accepted = [(x, 100 * w["speculative"]["acceptance_rate"])
                for x, w in zip(mids, windows, strict=True)
                if w["speculative"]["acceptance_rate"] is not None]  # fmt: skip
    if accepted:
        rate.plot(*zip(*accepted, strict=True), linestyle=":", color="#ff7f0e",
                  label="draft acceptance")  # fmt: skip
    rate.set_ylim(0, 100)
    rate.set_ylabel("draft acceptance (%)")
    lines = top.get_legend_handles_labels()[0] + rate.get_legend_handles_labels()[0]
    top.legend(lines, [ln.get_label() for ln in lines], fontsize=SMALLEST_PT, loc="upper left")
    top.grid(alpha=0.3)

    used = [(x, w["ratio"]) for x, w in zip(mids, windows, strict=True) if w["ratio"] is not None]
    if used:
        low.plot(*zip(*used, strict=True), linestyle="none", marker="o", markersize=4,
                 color="black", label="window ratio")  # fmt: skip
    skipped = [x for x, w in zip(mids, windows, strict=True) if w["skipped"]]
    if skipped:
        low.plot(skipped, [1.0] * len(skipped), linestyle="none", marker="x", color="#7f7f7f",
                 label="window skipped (too few requests)")  # fmt: skip
    for decision in result["decisions"]:
        color = LIVE_VERDICT_COLORS[decision["verdict"]]
        x0, x1 = minutes(decision["start"]), minutes(decision["end"])
        if decision["low"] is not None:
            low.fill_between([x0, x1], decision["low"], decision["high"], color=color, alpha=0.2,
                             linewidth=0)  # fmt: skip
        low.plot([x0, x1], [decision["ratio"]] * 2, color=color, linewidth=3)
        low.annotate(f"{decision['verdict']} {decision['ratio']:.2f}x", ((x0 + x1) / 2,
                     decision["high"] or decision["ratio"]), textcoords="offset points",
                     xytext=(0, 4), ha="center", fontsize=SMALLEST_PT, color=color)  # fmt: skip
    low.axhline(1.0, color="black", linewidth=1, linestyle="--")
    low.set_ylabel("speculative / baseline TPOT")
    low.set_xlabel(f"minutes ({settings['window_s']} s windows, {settings['windows_per_decision']}"
                   f" per decision, alpha {settings['alpha']:g})")  # fmt: skip
    rolled = [s for s in state["steps"] if s["action"] in (live_rule.FALL_BACK, live_rule.RETURN)]
    for ax in (top, low):
        for t in (marks or {}).values():
            ax.axvline(minutes(t), color="#9467bd", linewidth=1.2, linestyle="-.")
        for step in rolled:
            ax.axvline(minutes(step["end"]), color="#d62728", linewidth=1.2)
    ymax = low.get_ylim()[1]  # along their lines: clear of the decisions' labels
    for label, t in (marks or {}).items():
        low.text(minutes(t), ymax, f"{label} ", va="top", ha="right", rotation=90,
                 fontsize=SMALLEST_PT, color="#9467bd")  # fmt: skip
    for step in rolled:
        low.text(minutes(step["end"]), ymax, f"autopilot: {step['action']} ", va="top",
                 ha="right", rotation=90, fontsize=SMALLEST_PT, color="#d62728")  # fmt: skip
    low.legend(fontsize=SMALLEST_PT, loc="lower right")
    low.grid(alpha=0.3)
    top.set_title("speculation judged on live traffic: both arms behind one balancer, paired "
                  "windows", fontsize=9)  # fmt: skip
    return save(fig, path)
