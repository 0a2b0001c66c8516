"""summary.md of a compare or tune run: the tables, acceptance lines and conditions, rendered from
the summary report.py built (never from anything else)."""

from __future__ import annotations

import json

from specdeploy.decide.choose import CHOOSE_K_RULE
from specdeploy.decide.decisions import METRICS
from specdeploy.decide.tune_rule import SHARED_SERVER_NOTE
from specdeploy.report.bench_summary import format_curve


def _f(x, digits=2) -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and x != x:
        return "–"
    return f"{x:.{digits}f}"


def _arm_table(arms: dict, ratios: dict, names=("baseline", "speculative")) -> list[str]:
    a, b = names
    lines = [
        f"| metric | {a} median | {a} MAD | {b} median | {b} MAD | ratio {b}/{a} | interval | "
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
        f"{w.get('max_concurrency')}, seed {w.get('seed')}, temperature {w.get('temperature', 0)}, "
        f"top_p {w.get('top_p', 1.0)}, --ignore-eos",
        *_request_set_line(cond),
        f"- repeats per arm {_repeats(cond.get('repeats'))}, warm-up runs discarded "
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
    if cond.get("instance"):  # a whole box: one instance measured, the others serving meanwhile
        lines.append(
            f"- whole box: measured instance `{cond['instance']}` alone ({cond.get('devices')}, "
            f"port {cond.get('instance_port')}), drained from the balancer while the other "
            f"{(cond.get('instances') or 1) - 1} kept serving on port "
            f"{(cond.get('balancer') or {}).get('vllm_port')}; back in the balancer once healthy"
        )
    return lines


def _repeats(value) -> str:
    """conditions' repeats: a fixed count, or None where the rule sets it as the runs come in."""
    if value is not None:
        return str(value)
    return "set by the rule (the sequential compare's looks, or the fewest runs choose_k needs)"


def _restarts(value) -> str:
    """conditions' restart_between_samples: True (every sample), or how it was done instead."""
    return "for every sample" if value is True else str(value)


def _sequential_lines(seq: dict | None) -> list[str]:
    """The sequential compare's steps (report.sequential_steps): every round's p and action, and
    what stopped it."""
    if not seq:
        return []
    looks = ", ".join(f"{lk['runs']} (level {lk['level']:.3g})" for lk in seq["looks"])
    lines = [
        "",
        f"Sequential compare on TPOT: looks at runs per arm {looks}, budget {seq['max_runs']} "
        f"runs per arm, spending {seq['spending']}. {seq['rule']}.",
        "",
        "| runs per arm | look level | p | action |",
        "|---|---|---|---|",
    ]
    for st in seq["steps"]:
        lines.append(
            f"| {st['runs_per_arm']} | {_f(st['look_level'], 4)} | {_f(st['p_value'], 4)} | "
            f"{st['action']} |"
        )
    return lines + ["", f"Stopped by {seq['stopped_by']}: {seq['reason']}."]


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
        "`ratios.png` (speculative/baseline with its interval), `apc.png` (APC profile), "
        "`acceptance.png` (acceptance by draft position).",
        "",
    ]
    if s["fleet"]:
        f = s["fleet"]
        lines += [
            f"## Fleet ({len(f['hosts'])} hosts: ratios from each host's own runs, medians pooled)",
            "",
        ]
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
        lines += _sequential_lines(h.get("sequential"))
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


def tune_markdown(s: dict) -> str:

    lines = [
        f"# num_speculative_tokens sweep: {s['run']}",
        "",
        s["notes"]["samples"],
        "",
        "Prefix caching was OFF in every measurement instance. **ITL ≠ TPOT.** "
        f"{s['notes']['itl_vs_tpot']}",
        "",
        f"Rule: {CHOOSE_K_RULE}. Charts: `tune_tpot.png`, `acceptance.png` (acceptance by "
        "draft position, per k).",
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
            f"(currently {h['current_k']}; speculation {c.get('speculation')}). {c['verdict']}.",
            "",
        ]
        lines.append(
            f"Host-data change: `{h['host_data_change']}`"
            if h["host_data_change"]
            else "No change: the current k is the recommended one."
        )
        lines += [
            "",
            "| k | TPOT median (ms) | TPOT MAD | ratio to best | not slower than best | E2EL "
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


def flow_markdown(name: str, s: dict) -> list[str]:
    """The predict flow's section of a tune summary.md (tune_flow.flow_summary)."""
    r, d, t = s["record"], s["decision"], s["time"]
    rec = d["recommended_k"]
    vs = d["per_k"].get(rec, {}) if rec is not None else {}
    lines = [
        f"### {name}: predicted, then confirmed (tune_method = predict)",
        "",
        f"Pinned: baseline + k = {r['pinned_k']} (one run each after the warm-up); step model: "
        f"{r['model']}. Predicted best k = {r['predicted_best_k']}; confirmed k = {r['confirm_k']} "
        f"with the baseline, {r.get('runs_per_arm', '–')} runs each ({r['extensions']} window "
        "extension(s)). The recommendation uses measured runs only."
        + (
            f" Only the predicted best was confirmed: {r['predicted_off']}."
            if r.get("predicted_off")
            else ""
        ),
        "",
        f"Recommended k = **{rec if rec is not None else 'none: leave speculation off'}** (best "
        f"measured {d['best_k']}); TPOT / baseline = {_f(vs.get('ratio_to_baseline'), 3)}, "
        f"p (faster than the baseline) = {_f(vs.get('p_faster_than_baseline'), 3)}. "
        f"{d['verdict']}.",
        "",
        "| k | role | L(k) | predicted TPOT ms | band | measured TPOT ms (runs) | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in s["rows"]:
        error = "–" if row["error"] is None else f"{row['error']:+.1%}"
        band = (
            "–"
            if row["predicted_tpot_ms"] is None
            else f"{_f(row['predicted_low'])} – {_f(row['predicted_high'])}"
        )
        lines.append(
            f"| {row['k']} | {row['role']} | {_f(row['acceptance_length'], 3)} | "
            f"{_f(row['predicted_tpot_ms'])} | {band} | {_f(row['measured_tpot_ms'])} "
            f"({row['measured_runs']}) | {error} |"
        )
    if r.get("share_server"):
        pc = r.get("prefix_cache") or {}
        lines += [
            "",
            SHARED_SERVER_NOTE,
            f"Prefix-cache counters (server /metrics, benchmark requests only): {pc}.",
        ]
    lines += [
        "",
        f"Time: {t['seconds']} s for {t['samples']} samples ({t['server_starts']} server starts): "
        f"pin phase {t['pin_seconds']} s, confirm phase {t['confirm_seconds']} s (sample time, "
        f"server start included). The exhaustive sweep of tune_k would take "
        f"{t['sweep_samples_for_comparison']} samples.",
        "",
    ]
    return lines
