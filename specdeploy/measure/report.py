"""reports/<run>/summary.md, summary.json and PNG charts, built ONLY from the raw files a run wrote
(reports/<run>/raw/<host>/conditions.json and NN-<arm>.json, each a `vllm bench serve` result JSON
with a "specdeploy" key), so every number can be recomputed from them.

    python -m specdeploy.report reports/<run>      # rebuild a run's summary from its raw files
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..bench import format_curve
from ..timestamps import utc_iso
from .decisions import (
    ITL_NOTE,
    METRICS,
    TEXT_NOTE,
    acceptance_summary,
    arm_summary,
    choose_k,
    compare_arms,
    host_data_change,
    run_values,
)
from .tune_flow import flow_markdown, flow_summary

CHART_METRICS = ["ttft", "tpot", "itl", "e2el", "output_throughput"]
APC_NOTE = (
    "Automatic prefix caching was OFF in every baseline and speculative measurement instance "
    "(--no-enable-prefix-caching), so the speculative figures contain no cache effect. The APC "
    "profile below is separate: the baseline server with prefix caching off vs on, on requests "
    "that share long prefixes; it is never mixed into the speculative figures."
)
SAMPLE_NOTE = (
    "One sample = one `vllm bench serve` run against a freshly restarted server (after a discarded "
    "warm-up completion); per metric each run contributes its own median (or its throughput). "
    "Medians and MAD (unscaled median absolute deviation) are over runs. Arms alternate A B A B; "
    "warm-up runs are discarded. Ratio = median(speculative) / median(baseline); the noise band is "
    "[(m_s - MAD_s)/(m_b + MAD_b), (m_s + MAD_s)/(m_b - MAD_b)]; 'better'/'worse' only when the "
    "whole band is on one side of 1, else 'within noise'. With few runs on a shared CPU the band "
    "is wide: that is the honest answer, not a defect."
)


# --- loading --------------------------------------------------------------------------------------


def load_run(run_dir: Path) -> dict[str, dict]:
    """{host: {"conditions": ..., "runs": [result, ...] in index order}} for hosts that finished."""
    hosts = {}
    for hdir in sorted((Path(run_dir) / "raw").glob("*")):
        cond_file = hdir / "conditions.json"
        if not cond_file.is_file():
            continue
        cond = json.loads(cond_file.read_text())
        if "finished_at" not in cond:
            continue  # failed part-way: not reported
        runs = []
        for f in sorted(hdir.glob("[0-9][0-9]-*.json")):
            result = json.loads(f.read_text())
            result["specdeploy"]["file"] = str(f.relative_to(run_dir))
            runs.append(result)
        hosts[hdir.name] = {
            "conditions": cond,
            "runs": sorted(runs, key=lambda r: r["specdeploy"]["index"]),
        }
    return hosts


def measured(runs: list[dict], arm: str) -> list[dict]:
    return [r for r in runs if r["specdeploy"]["arm"] == arm and not r["specdeploy"]["warmup"]]


def _run_row(r: dict) -> dict:
    s = r["specdeploy"]
    return {
        "file": s["file"],
        "index": s["index"],
        "arm": s["arm"],
        "warmup": s["warmup"],
        **{m: r.get(key) for m, (key, *_) in METRICS.items()},
        "completed": r.get("completed"),
        "failed": r.get("failed"),
        "server_counters": s.get("server_counters"),
        "prefix_cache": s.get("prefix_cache"),
        "bench_spec_decode_acceptance_rate_pct": r.get("spec_decode_acceptance_rate"),
        "bench_spec_decode_acceptance_length": r.get("spec_decode_acceptance_length"),
    }


def _apc(runs: list[dict]) -> dict | None:
    off, on = measured(runs, "apc-off"), measured(runs, "apc-on")
    if not off or not on:
        return None
    hits = [r["specdeploy"]["prefix_cache"] for r in on]
    queries = sum(h.get("queries", 0) for h in hits)
    return {
        "arms": {"apc-off": arm_summary(off), "apc-on": arm_summary(on)},
        "ratios_on_over_off": compare_arms(on, off),
        "prefix_cache_hit_rate_on": (sum(h.get("hits", 0) for h in hits) / queries)
        if queries
        else None,
    }


# --- compare --------------------------------------------------------------------------------------


def compare_summary(run_dir: Path) -> dict:
    run_dir = Path(run_dir)
    hosts = load_run(run_dir)
    out = {
        "schema": 1,
        "kind": "compare",
        "run": run_dir.name,
        "created_at": utc_iso(),
        "notes": {
            "prefix_caching": APC_NOTE,
            "itl_vs_tpot": ITL_NOTE,
            "samples": SAMPLE_NOTE,
            "generated_text": TEXT_NOTE,
        },
        "hosts": {},
        "fleet": None,
    }
    all_spec, all_base = [], []
    for name, h in hosts.items():
        runs = h["runs"]
        spec, base = measured(runs, "speculative"), measured(runs, "baseline")
        all_spec += spec
        all_base += base
        out["hosts"][name] = {
            "conditions": h["conditions"],
            "arms": {"baseline": arm_summary(base), "speculative": arm_summary(spec)},
            "ratios": compare_arms(spec, base),
            "acceptance": acceptance_summary([r["specdeploy"]["server_counters"] for r in spec]),
            "apc_profile": _apc(runs),
            "runs": [_run_row(r) for r in runs],
        }
    if hosts:
        out["fleet"] = {
            "hosts": list(hosts),
            "how": (
                "every host's measured runs pooled (one value per run); "
                "per-host ratios listed alongside"
            ),
            "arms": {"baseline": arm_summary(all_base), "speculative": arm_summary(all_spec)},
            "ratios": compare_arms(all_spec, all_base),
            "acceptance": acceptance_summary(
                [r["specdeploy"]["server_counters"] for r in all_spec]
            ),
            "per_host_tpot_ratio": {n: h["ratios"]["tpot"] for n, h in out["hosts"].items()},
        }
    return out


def _f(x, digits=2) -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and x != x:
        return "–"
    return f"{x:.{digits}f}"


def _arm_table(arms: dict, ratios: dict, names=("baseline", "speculative")) -> list[str]:
    a, b = names
    lines = [
        f"| metric | {a} median | {a} MAD | {b} median | {b} MAD | ratio {b}/{a} | noise band | "
        "verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, (_, label, unit, lower) in METRICS.items():
        x, y, r = arms[a][m], arms[b][m], ratios[m]
        band = (
            f"{_f(r['low'], 3)} – {_f(r['high'], 3) if r['high'] is not None else '∞'}"
            if r["ratio"] is not None
            else "–"
        )
        lines.append(
            f"| {label} ({unit}, {'lower' if lower else 'higher'} is better) | {_f(x['median'])} | "
            f"{_f(x['mad'])} | {_f(y['median'])} | {_f(y['mad'])} | {_f(r['ratio'], 3)} | {band} | "
            f"{r['verdict']} |"
        )
    return lines


def _acceptance_lines(acc: dict) -> list[str]:
    rate = acc["acceptance_rate"]
    return [
        f"Acceptance (server /metrics, prometheus_client, benchmark requests only): rate "
        f"**{_f(rate * 100 if rate is not None else None, 1)} %** ({acc['accepted_tokens']:.0f} "
        "accepted of "
        f"{acc['draft_tokens']:.0f} draft tokens in {acc['drafts']:.0f} drafts), mean acceptance "
        "length "
        f"**{_f(acc['mean_acceptance_length'])}** tokens per target step, over {acc['runs']} runs."
    ] + _per_position_lines(acc)


def _per_position_lines(acc: dict) -> list[str]:
    """The acceptance curve (share of drafts whose i-th token was accepted; `acceptance.png`)."""
    if not acc.get("per_position"):
        return []
    return [
        "",
        "Acceptance by draft position (share of drafts whose i-th token was accepted): "
        + format_curve(acc["per_position"])
        + ".",
    ]


def _request_set_line(cond: dict) -> list[str]:
    rs = cond.get("request_set")
    if not rs:
        return []
    return [
        f"- request set: `{rs['control_path']}` ({rs['dataset']}, {rs['rows']} rows, "
        f"{rs['distinct_prompts']} distinct prompts, sha256 `{rs['sha256']}`; "
        + (
            "per-request output_tokens)"
            if rs["per_request_output_tokens"]
            else "output_len for every request)"
        )
    ]


def _conditions_lines(cond: dict) -> list[str]:
    w = cond.get("workload", {})
    lines = [
        f"- vLLM {cond.get('vllm', {}).get('package')} {cond.get('vllm', {}).get('version')}; "
        f"memory {cond.get('memory')}; limits {cond.get('limits')}",
        f"- workload: dataset {w.get('dataset')}, prompt {w.get('prompt_len')} / output "
        f"{w.get('output_len')} tokens, "
        f"{w.get('num_prompts')} prompts, request rate {w.get('request_rate')}/s, max concurrency "
        f"{w.get('max_concurrency')}, seed {w.get('seed')}, temperature 0, --ignore-eos",
        *_request_set_line(cond),
        f"- repeats per arm {cond.get('repeats')}, warm-up runs discarded "
        f"{cond.get('warmup_runs')}, order "
        f"{cond.get('order')}, server restarted "
        f"{_restarts(cond.get('restart_between_samples', True))}; "
        f"prefix caching: {cond.get('prefix_caching')}",
        f"- speculative_config: `{json.dumps(cond.get('speculative_config'), sort_keys=True)}`",
        f"- baseline argv: `{' '.join(cond.get('baseline_argv', []))}`",
        f"- speculative argv: `{' '.join(cond.get('speculative_argv', []))}`",
        f"- bench: `vllm {' '.join(cond.get('bench_args', []))}`",
        f"- measured {cond.get('started_at')} – {cond.get('finished_at')} ({cond.get('seconds')} "
        f"s); host left on `{cond.get('restored_unit')}` ({cond.get('restored_role')}), healthy",
    ]
    return lines


def _restarts(value) -> str:
    """conditions' restart_between_samples: True (every sample), or how it was done instead."""
    return "for every sample" if value is True else str(value)


def compare_markdown(s: dict) -> str:
    lines = [
        f"# Baseline vs speculative: {s['run']}",
        "",
        s["notes"]["prefix_caching"],
        "",
        f"**ITL ≠ TPOT.** {s['notes']['itl_vs_tpot']}",
        "",
        s["notes"]["samples"],
        "",
        s["notes"]["generated_text"],
        "",
        "Charts: `latency.png` (medians, MAD bars, every run as a dot), "
        "`ratios.png` (speculative/baseline with noise band), `apc.png` (APC profile), "
        "`acceptance.png` (acceptance by draft position).",
        "",
    ]
    if s["fleet"]:
        f = s["fleet"]
        lines += [f"## Fleet ({len(f['hosts'])} hosts, runs pooled)", ""]
        lines += (
            _arm_table(f["arms"], f["ratios"]) + [""] + _acceptance_lines(f["acceptance"]) + [""]
        )
        lines += ["| host | TPOT ratio | band | verdict |", "|---|---|---|---|"]
        for n, r in f["per_host_tpot_ratio"].items():
            lines.append(
                f"| {n} | {_f(r['ratio'], 3)} | {_f(r['low'], 3)} – {_f(r['high'], 3)} | "
                f"{r['verdict']} |"
            )
        lines.append("")
    for name, h in s["hosts"].items():
        lines += (
            [f"## {name}", ""]
            + _arm_table(h["arms"], h["ratios"])
            + [""]
            + _acceptance_lines(h["acceptance"])
        )
        lines += ["", "Conditions:", ""] + _conditions_lines(h["conditions"]) + [""]
        if h["apc_profile"]:
            a = h["apc_profile"]
            pc = h["conditions"].get("apc_profile", {})
            lines += [
                f"### {name}: prefix-caching profile (separate; baseline server, no speculation)",
                "",
                f"Requests share long prefixes: vLLM bench `prefix_repetition`, {pc}. Ratio = APC "
                "on / APC off. Prefix-cache hit rate with APC on: "
                f"{_f((a['prefix_cache_hit_rate_on'] or 0) * 100, 1)} %.",
                "",
            ]
            lines += _arm_table(a["arms"], a["ratios_on_over_off"], names=("apc-off", "apc-on")) + [
                ""
            ]
        lines += [
            f"### {name}: raw runs",
            "",
            "| # | arm | warm-up | TTFT | TPOT | ITL | E2EL | tok/s | file |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in h["runs"]:
            lines.append(
                f"| {r['index']} | {r['arm']} | {'yes' if r['warmup'] else ''} | {_f(r['ttft'])} | "
                f"{_f(r['tpot'])} | {_f(r['itl'])} | {_f(r['e2el'])} | "
                f"{_f(r['output_throughput'], 1)} | "
                f"`{r['file']}` |"
            )
        lines.append("")
    return "\n".join(lines)


# --- tune -----------------------------------------------------------------------------------------


def tune_summary(run_dir: Path) -> dict:
    run_dir = Path(run_dir)
    hosts = load_run(run_dir)
    out = {
        "schema": 1,
        "kind": "tune",
        "run": run_dir.name,
        "created_at": utc_iso(),
        "notes": {
            "samples": SAMPLE_NOTE.replace(
                "Arms alternate A B A B", "The k order rotates every round"
            ),
            "prefix_caching": "prefix caching OFF in every instance",
            "itl_vs_tpot": ITL_NOTE,
            "generated_text": TEXT_NOTE,
        },
        "hosts": {},
    }
    for name, h in hosts.items():
        ks = h["conditions"]["ks"]
        by_k = {k: measured(h["runs"], f"k{k}") for k in ks}
        tpot = {k: run_values(runs, "tpot") for k, runs in by_k.items()}
        choice = choose_k(tpot)
        # tune_method = predict (tune_flow.py): predicted vs measured, choice over confirmed k only
        flow = _predict_flow(run_dir / "raw" / name, h)
        if flow:
            choice = flow["decision"]
        spec = h["conditions"]["speculative_config"]
        out["hosts"][name] = {
            "conditions": h["conditions"],
            "per_k": {
                str(k): {
                    "arms": arm_summary(runs),
                    "acceptance": acceptance_summary(
                        [r["specdeploy"]["server_counters"] for r in runs]
                    ),
                }
                for k, runs in by_k.items()
            },
            "choice": {**choice, "per_k": {str(k): v for k, v in choice["per_k"].items()}},
            "current_k": spec.get("num_speculative_tokens"),
            "host_data_change": (
                None
                if choice["recommended_k"] == spec.get("num_speculative_tokens")
                else host_data_change(name, spec, choice["recommended_k"])
            ),
            "runs": [_run_row(r) for r in h["runs"]],
            "predict_flow": flow,
        }
    return out


def _predict_flow(host_dir: Path, h: dict) -> dict | None:
    record = host_dir / "prediction.json"
    if h["conditions"].get("tune_method") != "predict" or not record.is_file():
        return None

    return flow_summary(h["runs"], json.loads(record.read_text()), h["conditions"])


def tune_markdown(s: dict) -> str:

    lines = [
        f"# num_speculative_tokens sweep: {s['run']}",
        "",
        s["notes"]["samples"],
        "",
        "Prefix caching was OFF in every measurement instance. **ITL ≠ TPOT.** "
        f"{s['notes']['itl_vs_tpot']}",
        "",
        "Rule: the smallest k whose TPOT is within the noise band of the best k "
        "(median(k) − MAD(k) ≤ median(best) + MAD(best)). Charts: `tune_tpot.png`, "
        "`acceptance.png` (acceptance by draft position, per k).",
        "",
        "Nothing was edited: apply the printed host-data change yourself (group_data is never "
        "touched).",
        "",
    ]
    for name, h in s["hosts"].items():
        c = h["choice"]
        lines += [
            f"## {name}",
            "",
            f"best k = {c['best_k']}, **recommended k = {c['recommended_k']}** "
            f"(currently {h['current_k']}).",
            "",
        ]
        if any(v["n"] < 2 for v in c["per_k"].values()):
            lines += [
                "**Only one run for some k: there is no noise estimate (MAD 0), so 'within noise "
                "of best' means equal. Use tune_repeats >= 2 (default 3) before acting on this.**",
                "",
            ]
        lines.append(
            f"Host-data change: `{h['host_data_change']}`"
            if h["host_data_change"]
            else "No change: the current k is the recommended one."
        )
        lines += [
            "",
            "| k | TPOT median (ms) | TPOT MAD | ratio to best | within noise of best | E2EL "
            "median (ms) | tok/s median | acceptance rate % | mean acceptance length |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for k, v in c["per_k"].items():
            pk = h["per_k"][k]
            acc = pk["acceptance"]
            rate = acc["acceptance_rate"]
            rate_pct = rate * 100 if rate is not None else None
            lines.append(
                f"| {k} | {_f(v['median'])} | {_f(v['mad'])} | {_f(v['ratio_to_best'], 3)} | "
                f"{'yes' if v['within_noise_of_best'] else 'no'} | "
                f"{_f(pk['arms']['e2el']['median'])} | "
                f"{_f(pk['arms']['output_throughput']['median'], 1)} | "
                f"{_f(rate_pct, 1)} | "
                f"{_f(acc['mean_acceptance_length'])} |"
            )
        lines += [""] + [
            f"- k={k}: acceptance by draft position "
            + format_curve(pk["acceptance"]["per_position"])
            for k, pk in h["per_k"].items()
            if pk["acceptance"].get("per_position")
        ]
        if h.get("predict_flow"):
            lines += [""] + flow_markdown(name, h["predict_flow"])
        lines += ["", "Conditions:", ""] + _conditions_lines(h["conditions"]) + [""]
    return "\n".join(lines)


# --- charts ---------------------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(run_dir / "latency.png", dpi=110)
    plt.close(fig)
    written.append("latency.png")

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
        "ratio of medians with noise band (green better, red worse, grey within noise)", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(run_dir / "ratios.png", dpi=110)
    plt.close(fig)
    written.append("ratios.png")

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
        fig.tight_layout(rect=(0, 0, 1, 0.9))
        fig.savefig(run_dir / "apc.png", dpi=110)
        plt.close(fig)
        written.append("apc.png")
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
        ax.plot(
            [rk],
            [per_k[str(rk)]["median"]],
            "*",
            markersize=16,
            color="gold",
            markeredgecolor="black",
        )
    ax.set_xlabel("num_speculative_tokens (k)")
    ax.set_ylabel("TPOT median over runs (ms), MAD bars")
    ax.set_title("TPOT by k (star = recommended: smallest k within noise of the best)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(run_dir / "tune_tpot.png", dpi=110)
    plt.close(fig)
    return ["tune_tpot.png"]


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
    fig.tight_layout()
    fig.savefig(run_dir / "acceptance.png", dpi=110)
    plt.close(fig)
    return ["acceptance.png"]


def _acceptance_curves(s: dict, kind: str) -> dict[str, list[float]]:
    if kind == "compare":
        return {name: h["acceptance"].get("per_position") for name, h in s["hosts"].items()}
    return {
        f"{name} k={k}": pk["acceptance"].get("per_position")
        for name, h in s["hosts"].items()
        for k, pk in h["per_k"].items()
    }


# --- writing --------------------------------------------------------------------------------------


def write(run_dir: Path, kind: str | None = None) -> dict:
    """Build and write summary.json, summary.md and the charts of one run; returns the summary."""
    run_dir = Path(run_dir)
    if kind is None:
        conds = [json.loads(p.read_text()) for p in (run_dir / "raw").glob("*/conditions.json")]
        kind = conds[0].get("kind", "compare") if conds else "compare"
    s = compare_summary(run_dir) if kind == "compare" else tune_summary(run_dir)
    s["charts"] = compare_charts(s, run_dir) if kind == "compare" else tune_charts(s, run_dir)
    s["charts"] += acceptance_chart(
        _acceptance_curves(s, kind),
        run_dir,
        "Acceptance by draft position (server /metrics, benchmark requests, runs pooled)",
    )
    (run_dir / "summary.json").write_text(
        json.dumps(s, indent=1, sort_keys=True, default=str) + "\n"
    )
    (run_dir / "summary.md").write_text(
        (compare_markdown(s) if kind == "compare" else tune_markdown(s)) + "\n"
    )
    return s


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        written = write(Path(arg))
        print(f"{arg}: summary.md, summary.json, {', '.join(written['charts'])}")
