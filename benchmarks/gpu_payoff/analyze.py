"""Collect the device runs into results.json, then derive the payoff tables and payoff.png.

  python benchmarks/gpu_payoff/analyze.py collect OUT.json DEVICE_DIR...
      (summary.json + logs.tar.gz each)
  python benchmarks/gpu_payoff/analyze.py report results.json payoff.png
      (prints the REPORT tables)

Step time. At concurrency 1 a speculative engine step emits on average AL tokens (AL = measured
acceptance length incl. the bonus token), so step = TPOT x AL; for the baseline step = TPOT.

Spread. The device runs saved only vLLM's summary percentiles (bench_args has no --save-detailed, so
per-request values were not written). Each arm's MAD is therefore estimated from its P50 and P90
TPOT as 0.526 x (P90 - P50) (exact for normal data: MAD = 0.6745 sigma, P90 - P50 = 1.2816 sigma)
and fed to specdeploy.decide.stats.band_from_spread.

Leviathan et al. (2023): expected speedup = (1 - a^(k+1)) / ((1 - a)(k c + 1)) = L / (k c + 1), with
L = (1 - a^(k+1)) / (1 - a) the expected tokens per step and c = draft step time / target step time.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tarfile

from specdeploy.decide.stats import band_from_spread

P90_TO_MAD = 0.6745 / 1.2816


# ---------------------------------------------------------------- collect
def _log_metrics(text: str) -> dict:
    out = {}
    for key, pat in (
        ("p90_tpot_ms", r"P90 TPOT \(ms\):\s+([\d.]+)"),
        ("p90_itl_ms", r"P90 ITL \(ms\):\s+([\d.]+)"),
        ("p50_tpot_ms", r"P50 TPOT \(ms\):\s+([\d.]+)"),
    ):
        m = re.search(pat, text)
        if m:
            out[key] = float(m.group(1))
    return out


def collect(out_path: str, dirs: list[str]) -> None:
    records: dict[str, dict] = {}
    logs: dict[str, str] = {}
    for d in dirs:
        with tarfile.open(os.path.join(d, "logs.tar.gz")) as tar:
            for m in tar.getmembers():
                if m.isfile() and ".bench" in m.name:
                    logs[os.path.basename(m.name)] = (
                        tar.extractfile(m).read().decode(errors="replace")
                    )
        for r in json.load(open(os.path.join(d, "summary.json"))):
            if "bench" not in r and r["arm"] in records:
                continue  # a "skipped" entry never overrides a measured one
            r = {k: v for k, v in r.items() if k not in ("log_tail",)}
            for conc, b in r.get("bench", {}).items():
                for k in (
                    "per_request_tpot_ms",
                    "per_request_median_itl_ms",
                    "per_request_chunks",
                    "output_lens",
                ):
                    b.pop(k, None)  # empty: the bench did not save per-request data
                b.update(_log_metrics(logs.get(f"{r['arm']}.bench{conc}.log", "")))
            records[r["arm"]] = r
    with open(out_path, "w") as f:
        json.dump(
            {
                "device": "1x NVIDIA H200 (Firecracker), vLLM 0.26.0, torch 2.11.0+cu130",
                "records": list(records.values()),
            },
            f,
            indent=1,
        )
    print(f"{len(records)} arms -> {out_path}")


# ---------------------------------------------------------------- model
def alpha_from_length(length: float, k: int) -> float:
    """Solve L = (1 - a^(k+1)) / (1 - a) for a in [0, 1] (L in [1, k+1])."""
    if length >= k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        val = (1 - mid ** (k + 1)) / (1 - mid)
        lo, hi = (mid, hi) if val < length else (lo, mid)
    return (lo + hi) / 2


def leviathan(alpha: float, k: int, c: float) -> float:
    expected = (k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return expected / (k * c + 1)


# ---------------------------------------------------------------- report
def _arm(records, name):
    return next((r for r in records if r["arm"] == name and "bench" in r), None)


def _spread(b: dict) -> float:
    return max(0.0, b.get("p90_tpot_ms", b["median_tpot_ms"]) - b["median_tpot_ms"]) * P90_TO_MAD


def report(path: str, png: str) -> None:
    data = json.load(open(path))
    recs = data["records"]
    base = _arm(recs, "base")
    t_target = base["bench"]["1"]["median_tpot_ms"]
    draft = _arm(recs, "draft_alone")
    c_alone = draft["bench"]["1"]["median_tpot_ms"] / t_target
    print(
        f"target step (baseline TPOT, c=1) = {t_target:.2f} ms; draft alone = "
        f"{draft['bench']['1']['median_tpot_ms']:.2f} ms; c_alone = {c_alone:.3f}\n"
    )
    rows = []
    print(
        "| arm | k | L set | sched | c | TPOT med ms | TPOT P90 ms | ITL med ms | AL meas | "
        "step = TPOT x AL ms | "
        "TPOT ratio spec/base [band] | significant | speedup | c_eff | alpha | "
        "Leviathan at c_alone |"
    )
    print("|" + "---|" * 16)
    for r in recs:
        m = r["meta"]
        if m.get("kind") != "spec" or "bench" not in r:
            continue
        for conc in ("1", "8"):
            b, bb = r["bench"].get(conc), base["bench"].get(conc)
            if not b or "median_tpot_ms" not in b:
                continue
            k, length = m["k"], m["L"]
            al = b.get("spec_decode_acceptance_length") or length
            step = b["median_tpot_ms"] * al
            band = band_from_spread(
                b["median_tpot_ms"], _spread(b), bb["median_tpot_ms"], _spread(bb)
            )
            t_base = bb["median_tpot_ms"]
            c_eff = (step / t_base - 1) / k
            a = alpha_from_length(al, k)
            lev_alone = leviathan(
                a, k, c_alone
            )  # leviathan(a, k, c_eff) == measured speedup by construction
            name = r["arm"] + (" (draft eager)" if m.get("draft_eager") else "")
            rows.append(
                dict(
                    arm=r["arm"],
                    k=k,
                    L=length,
                    sched=m["sched"],
                    conc=int(conc),
                    tpot=b["median_tpot_ms"],
                    speedup=1 / band["ratio"],
                    step=step,
                    c_eff=c_eff,
                    alpha=a,
                    lev_alone=lev_alone,
                    draft_eager=bool(m.get("draft_eager")),
                )
            )
            print(
                f"| {name} | {k} | {length} | {m['sched']} | {conc} | {b['median_tpot_ms']:.2f} | "
                f"{b.get('p90_tpot_ms', float('nan')):.2f} | {b['median_itl_ms']:.2f} | "
                f"{al:.2f} | {step:.1f} | "
                f"{band['ratio']:.3f} [{band['low']:.3f}, {band['high']:.3f}] | "
                f"{'yes' if band['significant'] else 'no'} | {1 / band['ratio']:.2f}x | "
                f"{c_eff:.2f} | "
                f"{a:.2f} | {lev_alone:.2f}x |"
            )
    for name in ("base", "base_v1", "draft_alone"):
        r = _arm(recs, name)
        if r:
            cells = ", ".join(
                f"c={c}: TPOT {b['median_tpot_ms']:.2f} ms "
                f"(P90 {b.get('p90_tpot_ms', float('nan')):.2f})"
                for c, b in r["bench"].items()
                if "median_tpot_ms" in b
            )
            print(f"\n{name}: {cells}")
    _plot(rows, t_target, c_alone, png)


def _plot(rows, t_target, c_alone, png):
    """The two panels one above the other at the reports' width (specdeploy/report/charts.py), so
    the manual's column shows their text at its size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specdeploy.report.charts import SMALLEST_PT, WIDTH_IN, save

    fig, axes = plt.subplots(2, 1, figsize=(WIDTH_IN, 10.5))
    ax = axes[0]
    colors = {1: "tab:blue", 2: "tab:orange", 3: "tab:green", 5: "tab:red"}
    # lines: speedup predicted from each k's measured step time, TPOT(L) = step(k) / L
    steps: dict[int, list[float]] = {}
    for r in rows:
        if r["conc"] == 1 and r["sched"] == "async" and not r["draft_eager"]:
            steps.setdefault(r["k"], []).append(r["step"])
    for k, ss in sorted(steps.items()):
        lo, hi = min(ss), max(ss)
        ls = [1 + i * k / 100 for i in range(101)]
        ax.fill_between(
            ls,
            [t_target * x / hi for x in ls],
            [t_target * x / lo for x in ls],
            color=colors[k],
            alpha=0.15,
        )
        ax.plot(
            ls,
            [t_target * x / (sum(ss) / len(ss)) for x in ls],
            color=colors[k],
            lw=1,
            label=f"k={k}: step {sum(ss) / len(ss):.1f} ms -> speedup = {t_target:.2f} L / step",
        )
        ls2 = [1 + i * k / 100 for i in range(101)]
        ax.plot(
            ls2,
            [leviathan(alpha_from_length(x, k), k, c_alone) for x in ls2],
            color=colors[k],
            lw=1,
            ls=":",
        )
    for r in rows:
        if r["conc"] != 1:
            continue
        marker = "o" if r["sched"] == "async" else "x"
        if r["draft_eager"]:
            marker = "v"
        ax.scatter([r["L"]], [r["speedup"]], color=colors[r["k"]], marker=marker, s=50, zorder=3)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xlabel("acceptance length L (tokens per step, synthetic)")
    ax.set_ylabel("speedup = baseline TPOT / speculative TPOT")
    ax.set_title(
        "H200, Qwen3-8B target + Qwen3-0.6B draft, c=1\n"
        "points: measured (o async, x sync, v draft eager)\n"
        "solid: 5.24 ms x L / measured step(k); dotted: Leviathan with c_alone=0.34",
        fontsize=9,
    )
    ax.set_ylim(0, 3.2)
    ax.legend(fontsize=SMALLEST_PT, loc="upper left")
    ax = axes[1]
    ks = sorted({r["k"] for r in rows})
    ls = sorted({r["L"] for r in rows})
    grid = [[math.nan] * len(ls) for _ in ks]
    for r in rows:
        if r["conc"] == 1 and r["sched"] == "async" and not r["draft_eager"]:
            grid[ks.index(r["k"])][ls.index(r["L"])] = r["speedup"]
    im = ax.imshow(grid, cmap="RdYlGn", vmin=0.3, vmax=1.7, origin="lower", aspect="auto")
    for i, k in enumerate(ks):
        for j, length in enumerate(ls):
            if not math.isnan(grid[i][j]):
                ax.text(j, i, f"{grid[i][j]:.2f}x", ha="center", va="center", fontsize=10)
            elif length <= k + 1:
                pred = (
                    t_target * length / (sum(steps[k]) / len(steps[k])) if k in steps else math.nan
                )
                ax.text(
                    j,
                    i,
                    f"({pred:.2f}x)",
                    ha="center",
                    va="center",
                    fontsize=SMALLEST_PT,
                    color="dimgray",
                )
            else:
                ax.text(j, i, "L>k+1", ha="center", va="center", fontsize=SMALLEST_PT, color="gray")
    ax.set_xticks(range(len(ls)), [str(x) for x in ls])
    ax.set_yticks(range(len(ks)), [str(k) for k in ks])
    ax.set_xlabel("L")
    ax.set_ylabel("k (num_speculative_tokens)")
    ax.set_title(
        "payoff map, c=1, --async-scheduling\n"
        "black: measured; grey (x): 5.24 ms x L / step(k), not measured",
        fontsize=9,
    )
    fig.colorbar(im, ax=ax, label="speedup")
    save(fig, png)
    print(f"\nwrote {png}")


if __name__ == "__main__":
    if sys.argv[1] == "collect":
        collect(sys.argv[2], sys.argv[3:])
    else:
        report(sys.argv[2], sys.argv[3])
