"""The charts of a compare or tune report (matplotlib, Agg): PNGs beside summary.md."""

from __future__ import annotations

from pathlib import Path

from specdeploy.decide.decisions import METRICS

CHART_METRICS = ["ttft", "tpot", "itl", "e2el", "output_throughput"]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, run_dir: Path, name: str, rect=(0, 0, 1, 1)) -> str:
    """Lay out, write `run_dir/name` at the reports' one resolution, and free the figure."""
    plt = _plt()
    fig.tight_layout(rect=rect)
    fig.savefig(run_dir / name, dpi=110)
    plt.close(fig)
    return name


def compare_charts(s: dict, run_dir: Path) -> list[str]:
    plt = _plt()
    written = []
    groups = list(s["hosts"].items()) + (
        [("fleet", s["fleet"])] if s["fleet"] and len(s["hosts"]) > 1 else []
    )
    if not groups:
        return written
    fig, axes = plt.subplots(1, len(CHART_METRICS), figsize=(4 * len(CHART_METRICS), 4.2))
    colors = {"baseline": "#7f7f7f", "speculative": "#1f77b4"}
    for ax, m in zip(axes, CHART_METRICS, strict=True):
        _, label, unit, lower = METRICS[m]
        for gi, (_gname, g) in enumerate(groups):
            for ai, arm in enumerate(("baseline", "speculative")):
                a = g["arms"][arm][m]
                x = gi + (ai - 0.5) * 0.38
                if a["median"] is None:
                    continue
                ax.bar(
                    x,
                    a["median"],
                    width=0.36,
                    color=colors[arm],
                    yerr=a["mad"],
                    capsize=4,
                    label=arm if gi == 0 and m == CHART_METRICS[0] else None,
                )
                ax.scatter([x] * len(a["values"]), a["values"], color="black", s=10, zorder=3)
            v = g["ratios"][m]["verdict"]
            ax.text(
                gi,
                1.01,
                v,
                ha="center",
                va="bottom",
                fontsize=7,
                transform=ax.get_xaxis_transform(),
                color={"better": "#2ca02c", "worse": "#d62728"}.get(v, "#555555"),
            )
        ax.set_xticks(range(len(groups)), [g for g, _ in groups], rotation=20, fontsize=8)
        ax.set_title(
            f"{label.split(' (')[0]} ({unit})\n{'lower' if lower else 'higher'} is better\n",
            fontsize=9,
        )
    fig.legend(loc="upper right", fontsize=8)
    fig.suptitle(
        f"{s['run']}: medians over runs, MAD bars, dots = individual runs (prefix caching off)",
        fontsize=10,
    )
    written.append(_save(fig, run_dir, "latency.png", rect=(0, 0, 1, 0.92)))

    fig, ax = plt.subplots(figsize=(9, 1.5 + 1.1 * len(groups)))
    LIMITS, ticks = (0.2, 5.0), []  # band edges beyond the axis are drawn at its edge
    for mi, m in enumerate(CHART_METRICS):
        for gi, (gname, g) in enumerate(groups):
            r = g["ratios"][m]
            if r["ratio"] is None:
                continue
            y = gi * (len(CHART_METRICS) + 1) + mi
            clip = lambda x: min(max(x, LIMITS[0]), LIMITS[1])  # noqa: E731
            hi = r["high"] if r["high"] is not None else LIMITS[1]
            color = {"better": "#2ca02c", "worse": "#d62728"}.get(r["verdict"], "#7f7f7f")
            ax.plot([clip(r["low"]), clip(hi)], [y, y], color=color, lw=3, alpha=0.5)
            ax.plot([clip(r["ratio"])], [y], "o", color=color)
            ticks.append((y, f"{gname} {m}: {r['ratio']:.2f} ({r['verdict']})"))
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xscale("log")
    ax.set_xlim(*LIMITS)
    ax.set_xticks([0.25, 0.5, 1, 2, 4], ["0.25", "0.5", "1", "2", "4"])
    ax.minorticks_off()
    ax.set_yticks([t[0] for t in ticks], [t[1] for t in ticks], fontsize=7)
    ax.set_xlabel(
        "speculative / baseline (log scale, clipped to 0.2-5); latency < 1 is better, throughput > "
        "1 is better"
    )
    ax.set_title(
        "ratio of medians with its interval (green better, red worse, grey: not decided at alpha)",
        fontsize=9,
    )
    written.append(_save(fig, run_dir, "ratios.png"))

    apc = [(n, h["apc_profile"]) for n, h in s["hosts"].items() if h["apc_profile"]]
    if apc:
        fig, axes = plt.subplots(1, 3, figsize=(11, 3.8))
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
            ax.set_xticks(range(len(apc)), [n for n, _ in apc], fontsize=8)
            ax.set_title(f"{METRICS[m][1].split(' (')[0]} ({METRICS[m][2]})", fontsize=9)
        fig.legend(loc="upper right", fontsize=8)
        fig.suptitle(
            "prefix-caching profile (baseline server, shared-prefix requests): APC off vs on",
            fontsize=10,
        )
        written.append(_save(fig, run_dir, "apc.png", rect=(0, 0, 1, 0.9)))
    return written


def tune_charts(s: dict, run_dir: Path) -> list[str]:
    plt = _plt()
    if not s["hosts"]:
        return []
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, h in s["hosts"].items():
        per_k = h["choice"]["per_k"]
        ks = [int(k) for k in per_k]
        med = [per_k[str(k)]["median"] for k in ks]
        ax.errorbar(
            ks, med, yerr=[per_k[str(k)]["mad"] for k in ks], marker="o", capsize=4, label=name
        )
        rk = h["choice"]["recommended_k"]
        if rk is not None:
            ax.plot(
                [rk],
                [per_k[str(rk)]["median"]],
                "*",
                markersize=16,
                color="gold",
                markeredgecolor="black",
            )
        base = h["choice"].get("baseline")
        if base and base.get("median") is not None:
            ax.axhline(base["median"], color="#7f7f7f", linestyle="--", linewidth=1)
    ax.set_xlabel("num_speculative_tokens (k)")
    ax.set_ylabel("TPOT median over runs (ms), MAD bars")
    ax.set_title(
        "TPOT by k (star = recommended: smallest k not slower than the best and faster than the "
        "baseline, dashed)",
        fontsize=8,
    )
    ax.legend(fontsize=8)
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
    ax.legend(fontsize=8)
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
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return [_save(fig, run_dir, "load_ratio.png")]
