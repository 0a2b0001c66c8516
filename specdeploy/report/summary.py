"""reports/<run>/summary.md, summary.json and PNG charts, built ONLY from the raw files a run wrote
(reports/<run>/raw/<host>/conditions.json and NN-<arm>.json, each a `vllm bench serve` result JSON
with a "specdeploy" key), so every number can be recomputed from them.

    python -m specdeploy.report reports/<run>      # rebuild a run's summary from its raw files
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specdeploy.config.record import BenchResult, bench_result
from specdeploy.config.timestamps import utc_iso
from specdeploy.decide.choose import choose_k, fleet_ratio
from specdeploy.decide.decisions import (
    BETTER,
    DECIDE,
    ITL_NOTE,
    METRICS,
    NO_DIFFERENCE,
    NOT_COMPARABLE,
    RULE,
    TEXT_NOTE,
    TOO_FEW_RUNS,
    WORSE,
    acceptance_summary,
    arm_summary,
    compare_arms,
    host_data_change,
    next_step,
    run_values,
)
from specdeploy.decide.stats import DEFAULT_ALPHA
from specdeploy.decide.tune_rule import flow_summary
from specdeploy.report.charts import (
    acceptance_chart,
    acceptance_curves,
    compare_charts,
    load_chart,
    tune_charts,
)
from specdeploy.report.draft_summary import draft_markdown, draft_report
from specdeploy.report.load_summary import is_load_run, load_markdown, load_summary
from specdeploy.report.markdown import compare_markdown, tune_markdown

APC_NOTE = (
    "Automatic prefix caching was OFF in every baseline and speculative measurement instance "
    "(--no-enable-prefix-caching), so the speculative figures contain no cache effect. The APC "
    "profile below is separate: the baseline server with prefix caching off vs on, on requests "
    "that share long prefixes; it is never mixed into the speculative figures."
)
SAMPLE_NOTE = (
    "One sample = one `vllm bench serve` run against a freshly restarted server (after a discarded "
    "warm-up completion); per metric each run contributes its own median (or its throughput), and "
    "the run, not the request, is the unit of evidence. Medians and MAD (unscaled median absolute "
    "deviation) over runs describe the spread. Rounds alternate which arm goes first (B S, S B, "
    "...); warm-up runs are discarded. Ratio = median(speculative) / median(baseline) with the "
    "interval named beside it. Verdicts: " + RULE + ", at the run's decision_alpha (its "
    "false-verdict rate)."
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
            result = bench_result(json.loads(f.read_text()))
            result.run.file = str(f.relative_to(run_dir))
            runs.append(result)
        hosts[hdir.name] = {"conditions": cond, "runs": sorted(runs, key=lambda r: r.run.index)}
    return hosts


def measured(runs: list[BenchResult], arm: str) -> list[BenchResult]:
    return [r for r in runs if r.run.arm == arm and not r.run.warmup]


def _run_row(r: BenchResult) -> dict:
    s = r.run
    counters = s.server_counters
    return {
        "file": s.file,
        "index": s.index,
        "arm": s.arm,
        "warmup": s.warmup,
        **{m: r.figure(key) for m, (key, *_) in METRICS.items()},
        "completed": r.completed,
        "failed": r.failed,
        "server_counters": counters.model_dump(exclude_unset=True) if counters else None,
        "prefix_cache": s.prefix_cache if "prefix_cache" in s.model_fields_set else None,
        "bench_spec_decode_acceptance_rate_pct": r.spec_decode_acceptance_rate,
        "bench_spec_decode_acceptance_length": r.spec_decode_acceptance_length,
    }


def _apc(runs: list[BenchResult], alpha: float) -> dict | None:
    off, on = measured(runs, "apc-off"), measured(runs, "apc-on")
    if not off or not on:
        return None
    hits = [r.run.prefix_cache for r in on]
    queries = sum(h.get("queries", 0) for h in hits)
    return {
        "arms": {"apc-off": arm_summary(off), "apc-on": arm_summary(on)},
        "ratios_on_over_off": compare_arms(on, off, alpha=alpha),
        "prefix_cache_hit_rate_on": (sum(h.get("hits", 0) for h in hits) / queries)
        if queries
        else None,
    }


# --- compare --------------------------------------------------------------------------------------


def _head(run_dir: Path, kind: str, notes: dict) -> dict:
    """What every summary.json starts with; its hosts are filled in by the kind's summary."""
    return {"schema": 1, "kind": kind, "run": run_dir.name, "created_at": utc_iso(),
            "notes": notes, "hosts": {}}  # fmt: skip


def compare_summary(run_dir: Path) -> dict:
    run_dir = Path(run_dir)
    hosts = load_run(run_dir)
    notes = {"prefix_caching": APC_NOTE, "itl_vs_tpot": ITL_NOTE, "samples": SAMPLE_NOTE,
             "generated_text": TEXT_NOTE}  # fmt: skip
    out = _head(run_dir, "compare", notes) | {"fleet": None}
    all_spec, all_base = [], []
    for name, h in hosts.items():
        runs = h["runs"]
        alpha = _alpha(h["conditions"])
        spec, base = measured(runs, "speculative"), measured(runs, "baseline")
        all_spec += spec
        all_base += base
        out["hosts"][name] = {
            "conditions": h["conditions"],
            "arms": {"baseline": arm_summary(base), "speculative": arm_summary(spec)},
            "ratios": compare_arms(spec, base, alpha=alpha),
            "acceptance": acceptance_summary([r.counters for r in spec]),
            "apc_profile": _apc(runs, alpha),
            "runs": [_run_row(r) for r in runs],
            "sequential": None,
        }
        seq = h["conditions"].get("sequential")
        if seq:  # the TPOT verdict is the sequential rule's, at the level of the look it stopped at
            steps = sequential_steps(
                run_values(spec, "tpot"), run_values(base, "tpot"), seq, alpha=alpha
            )
            out["hosts"][name]["sequential"] = steps
            if steps["result"] is not None:
                out["hosts"][name]["ratios"]["tpot"] = steps["result"]
    if hosts:
        out["fleet"] = {
            "hosts": list(hosts),
            "how": (
                "ratios: the median of the per-host ratios (each host's runs against its own "
                "baseline), with a sign test over hosts; medians: every host's runs pooled, for "
                "reference only"
            ),
            "arms": {"baseline": arm_summary(all_base), "speculative": arm_summary(all_spec)},
            "ratios": _fleet_ratios(out["hosts"], _alpha(next(iter(hosts.values()))["conditions"])),
            "acceptance": acceptance_summary([r.counters for r in all_spec]),
            "per_host_tpot_ratio": {n: h["ratios"]["tpot"] for n, h in out["hosts"].items()},
        }
    return out


def sequential_steps(spec: list[float], base: list[float], seq: dict, *, alpha: float) -> dict:
    """The sequential compare replayed from the runs (in index order, i.e. round by round):
    decisions.next_step after every round from the first look on, as plans.sequential_compare_plan
    asked it while measuring. Returns conditions' `sequential` plus {steps [{runs_per_arm, action,
    look_level, p_value, verdict, reason}], decided, stopped_by ("a significant look", "the run
    budget", or why it did not decide), reason (the last step's), result (the verdict the run
    stopped on: compare_values at that look's level; None if it never decided)}."""
    steps, last = [], None
    for r in range(seq["first_runs"], min(len(spec), len(base)) + 1):
        last = next_step(spec[:r], base[:r], max_runs=seq["max_runs"], alpha=alpha)
        res = last["result"] or {}
        steps.append(
            {
                "runs_per_arm": r,
                "action": last["action"],
                "look_level": (last["look"] or {}).get("level"),
                "p_value": res.get("p_value"),
                "verdict": res.get("verdict"),
                "reason": last["reason"],
            }
        )
        if last["action"] == DECIDE:
            break
    decided = last is not None and last["action"] == DECIDE
    if not decided:
        stopped_by = f"the runs ended before the rule decided ({len(spec)} + {len(base)} runs)"
    elif last["result"]["significant"]:
        stopped_by = "a significant look"
    else:
        stopped_by = "the run budget"
    return {
        **seq,
        "steps": steps,
        "decided": decided,
        "stopped_by": stopped_by,
        "reason": last["reason"] if last else stopped_by,
        "result": last["result"] if decided else None,
    }


def _alpha(conditions: dict) -> float:
    return conditions.get("decision_alpha", DEFAULT_ALPHA)


def _fleet_ratios(hosts: dict, alpha: float) -> dict:
    """Per metric: choose.fleet_ratio over the hosts' own ratios (paired within each host), with
    the min-max spread over hosts as its band and the sign test's verdict."""
    out = {}
    for metric in METRICS:
        f = fleet_ratio({name: h["ratios"][metric]["ratio"] for name, h in hosts.items()})
        lower = METRICS[metric][3]
        sign = f.get("sign_test") or {}
        if not f["hosts"]:
            verdict = NOT_COMPARABLE
        elif min(1.0, 2 * 0.5 ** f["hosts"]) > alpha:  # the sign test's smallest p
            verdict = TOO_FEW_RUNS.replace("runs", "hosts")
        elif sign["p_value"] <= alpha:
            smaller = sign["below"] > sign["above"]  # speculative below its baseline
            verdict = BETTER if smaller == lower else WORSE
        else:
            verdict = NO_DIFFERENCE
        out[metric] = f | {"low": f.get("min"), "high": f.get("max"), "verdict": verdict}
    return out


# --- tune -----------------------------------------------------------------------------------------


def tune_summary(run_dir: Path) -> dict:
    run_dir = Path(run_dir)
    hosts = load_run(run_dir)
    notes = {
        "samples": SAMPLE_NOTE.replace(
            "Rounds alternate which arm goes first (B S, S B, ...)",
            "The order of the k and the baseline rotates every round",
        ),
        "prefix_caching": "prefix caching OFF in every instance",
        "itl_vs_tpot": ITL_NOTE,
        "generated_text": TEXT_NOTE,
    }
    out = _head(run_dir, "tune", notes)
    for name, h in hosts.items():
        ks = h["conditions"]["ks"]
        by_k = {k: measured(h["runs"], f"k{k}") for k in ks}
        tpot = {k: run_values(runs, "tpot") for k, runs in by_k.items()}
        baseline = run_values(measured(h["runs"], "baseline"), "tpot") or None
        choice = choose_k(tpot, baseline=baseline, alpha=_alpha(h["conditions"]))
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
                    "acceptance": acceptance_summary([r.counters for r in runs]),
                }
                for k, runs in by_k.items()
            },
            "choice": {**choice, "per_k": {str(k): v for k, v in choice["per_k"].items()}},
            "current_k": spec.get("num_speculative_tokens"),
            "host_data_change": (
                None
                if choice["recommended_k"] in (None, spec.get("num_speculative_tokens"))
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


# --- writing --------------------------------------------------------------------------------------


def write(run_dir: Path, kind: str | None = None) -> dict:
    """Build and write summary.json, summary.md and the charts of one run; returns the summary."""
    run_dir = Path(run_dir)
    if kind is None:
        conds = [json.loads(p.read_text()) for p in (run_dir / "raw").glob("*/conditions.json")]
        kind = conds[0].get("kind", "compare") if conds else "compare"
    hosts = load_run(run_dir)
    if kind == "choose_draft":  # which draft: the decision replayed from the raw files
        s = draft_report(hosts, run_dir, _head(run_dir, kind, {}))
        (run_dir / "summary.json").write_text(
            json.dumps(s, indent=1, sort_keys=True, default=str) + "\n"
        )
        (run_dir / "summary.md").write_text(draft_markdown(s) + "\n")
        return s
    if any(is_load_run(h["conditions"]) for h in hosts.values()):  # across load levels
        s = load_summary(hosts, _head(run_dir, kind, {}))
        s["charts"] = load_chart(s, run_dir)
        (run_dir / "summary.json").write_text(
            json.dumps(s, indent=1, sort_keys=True, default=str) + "\n"
        )
        (run_dir / "summary.md").write_text(load_markdown(s) + "\n")
        return s
    s = compare_summary(run_dir) if kind == "compare" else tune_summary(run_dir)
    s["charts"] = compare_charts(s, run_dir) if kind == "compare" else tune_charts(s, run_dir)
    s["charts"] += acceptance_chart(
        acceptance_curves(s, kind),
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
