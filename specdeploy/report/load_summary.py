"""The report of a measurement across load levels (issue 39), built only from the raw files like
every report: a load tune (tune_method = "load": a k per level, the schedule they call for, the
single k or "off" where the release has no schedule) and the proof of a schedule
(compare_across_load: the schedule against the baseline and the fixed k at every level)."""

from __future__ import annotations

import json
from pathlib import Path

from specdeploy.decide.decisions import ITL_NOTE, TEXT_NOTE
from specdeploy.decide.load_rule import (
    LOAD_RULE,
    PROOF_RULE,
    SCHEDULE_KEY,
    decide_levels,
    k_of,
    prove_schedule,
    proven_range,
    ratio_by_level,
    schedule_config,
    tpot_by_level,
    tune_recommendation,
)
from specdeploy.decide.stats import DEFAULT_ALPHA

LOAD_NOTE = (
    "Each visit is a freshly started server for one arm with one run per load level on it, lowest "
    "concurrency first: an arm's runs at one level come from distinct server starts, the unit of "
    "evidence. Ratio = median(arm) / median(baseline) at that level, with the exact rank-test "
    "interval at the level's share of alpha."
)


def is_load_run(conditions: dict) -> bool:
    return conditions.get("tune_method") == "load" or bool(conditions.get("across_load"))


def _alpha(cond: dict) -> float:
    return cond.get("decision_alpha", DEFAULT_ALPHA)


def _line(host: str, spec: dict) -> str:
    return f"host_data/{host}: speculative_config = {dict(sorted(spec.items()))!r}"


def _off(host: str) -> str:
    return f"host_data/{host}: leave speculation off (deploy without speculative_config)"


def load_tune_host(name: str, h: dict) -> dict:
    """One host's load tune: the decision per level, the recommendation and its host-data line,
    and each k's TPOT ratio to the baseline at every level."""
    cond, alpha = h["conditions"], _alpha(h["conditions"])
    by_level = tpot_by_level(h["runs"])
    runs = {c: {k_of(a): v for a, v in arms.items() if k_of(a) is not None}
            for c, arms in by_level.items()}  # fmt: skip
    decision = decide_levels(runs, alpha=alpha)
    rec = tune_recommendation(
        decision,
        max_num_seqs=cond["limits"]["max_num_seqs"],
        schedule_supported=cond.get("schedule_supported", False),
        data_parallel_size=cond.get("data_parallel_size", 1),
    )
    spec = cond["speculative_config"]
    # what to run now: the single k or off; a candidate schedule only once proven (prove_with)
    change = (
        _line(name, schedule_config(spec, None, rec["fixed"]["k"]))
        if rec["fixed"]["k"]
        else _off(name)
    )
    fixed_k = rec["fixed"]["k"] or spec.get("num_speculative_tokens")
    prove_with = (
        "SPECDEPLOY_COMPARE_ACROSS_LOAD=1 "
        f"SPECDEPLOY_COMPARE_SCHEDULE='{json.dumps(rec['schedule'])}' "
        f"SPECDEPLOY_COMPARE_FIXED_K={fixed_k} pyinfra INVENTORY deploys/compare.py"
        if rec["schedule"]
        else None
    )
    ratios = {f"k{k}": ratio_by_level(by_level, f"k{k}", alpha=alpha) for k in cond["ks"]}
    return {
        "conditions": cond,
        "decision": _str_keys(decision),
        "recommendation": rec,
        "host_data_change": change,
        "prove_with": prove_with,
        "ratios": {arm: _str_keys(r) for arm, r in ratios.items()},
        "proven_range": list(proven_range(list(by_level))) if by_level else None,
    }


def load_proof_host(name: str, h: dict) -> dict:
    """One host's proof: prove_schedule over the schedule's (or the plain speculative config's)
    runs, the baseline's and the fixed k's at every level."""
    cond, alpha = h["conditions"], _alpha(h["conditions"])
    by_level = tpot_by_level(h["runs"])
    deployed = "schedule" if "schedule" in cond["arms"] else "speculative"
    runs = {c: {"baseline": arms.get("baseline", []), "schedule": arms.get(deployed, []),
                "fixed": arms.get("fixed", [])} for c, arms in by_level.items()}  # fmt: skip
    spec = cond["speculative_config"]
    subject = (
        "the schedule"
        if deployed == "schedule" or SCHEDULE_KEY in spec
        else f"k = {spec.get('num_speculative_tokens')} (no schedule)"
    )
    proof = prove_schedule(runs, alpha=alpha, subject=subject)
    if proof["decision"] == "schedule":  # proven: deploy a candidate, keep a deployed one
        candidate = not cond.get("schedule_deployed", True) and cond.get("schedule")
        change = _line(name, schedule_config(spec, candidate)) if candidate else None
    elif proof["decision"] == "fixed":
        change = _line(name, schedule_config(spec, None, cond["fixed_k"]))
    else:
        change = _off(name)
    return {
        "conditions": cond,
        "host_data_change": change,
        "deployed": deployed,
        "schedule": cond.get("schedule", spec.get(SCHEDULE_KEY)),
        "proof": _str_keys(proof),
        "ratios": {
            arm: _str_keys(ratio_by_level(by_level, arm, alpha=alpha))
            for arm in cond["arms"]
            if arm != "baseline"
        },
        "proven_range": list(proven_range(list(by_level))) if proof["proven"] else None,
    }


def _str_keys(value):
    """JSON's object keys are strings: concurrency keys written as such, nested too."""
    if isinstance(value, dict):
        return {str(k): _str_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_str_keys(v) for v in value]
    return value


def load_summary(hosts: dict, head: dict) -> dict:
    """summary.json of a load run: `head` (summary._head) with each host's part."""
    notes = {"samples": LOAD_NOTE, "itl_vs_tpot": ITL_NOTE, "generated_text": TEXT_NOTE}
    out = head | {"notes": notes}
    for name, h in hosts.items():
        tune = h["conditions"].get("tune_method") == "load"
        out["hosts"][name] = load_tune_host(name, h) if tune else load_proof_host(name, h)
        out["hosts"][name]["rule"] = LOAD_RULE if tune else PROOF_RULE
    return out


def load_markdown(s: dict) -> str:
    """summary.md of a load run: per host, a table of TPOT ratio by level, and the verdict."""
    lines = [f"# {s['run']}: {s['kind']} across load levels", "", s["notes"]["samples"], ""]
    for name, h in s["hosts"].items():
        lines += [f"## {name}", ""]
        arms = list(h["ratios"])
        levels = sorted({int(c) for r in h["ratios"].values() for c in r})
        lines += ["| concurrency | " + " | ".join(arms) + " |",
                  "|---|" + "---|" * len(arms)]  # fmt: skip
        for c in levels:
            cells = []
            for arm in arms:
                r = h["ratios"][arm].get(str(c))
                cells.append(
                    "–"
                    if not r or r["ratio"] is None
                    else f"{r['ratio']:.2f} ({_fmt(r['low'])}-{_fmt(r['high'])})"
                )
            lines.append(f"| {c} | " + " | ".join(cells) + " |")
        lines.append("")
        if "recommendation" in h:
            lines += [f"**Recommendation:** {h['recommendation']['verdict']}", "",
                      f"`{h['host_data_change']}`", ""]  # fmt: skip
            if h["prove_with"]:
                lines += [f"Prove the candidate schedule: `{h['prove_with']}`", ""]
        else:
            lines += [f"**Proof:** {h['proof']['verdict']}", ""]
            if h["host_data_change"]:
                lines += [f"`{h['host_data_change']}`", ""]
        lines += [f"Rule: {h['rule']}", ""]
    return "\n".join(lines)


def _fmt(x) -> str:
    return "–" if x is None else f"{x:.2f}"


# --- the evidence a deployed schedule carries in its record -------------------------------------


def latest_proof(root: Path, host: str, schedule: list) -> dict | None:
    """The newest proof under the reports root `root` (compare_across_load's summary.json) that
    measured exactly `schedule` on `host`: {run, proven, decision, verdict, alpha, level_alpha,
    levels {concurrency: {ratio, low, high, verdict} of the schedule against the baseline}}, or
    None where no proof of it was run from this control node."""
    summaries = sorted(root.glob("*/summary.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in summaries:
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        h = (summary.get("hosts") or {}).get(host) or {}
        if "proof" not in h or h.get("schedule") != schedule:
            continue
        proof = h["proof"]
        levels = {
            c: {key: lv["vs_baseline"][key] for key in ("ratio", "low", "high", "verdict")}
            for c, lv in proof["levels"].items()
        }
        keep = ("proven", "decision", "verdict", "alpha", "level_alpha")
        return {"run": summary.get("run"), **{key: proof[key] for key in keep}, "levels": levels}
    return None


def schedule_evidence(root: Path, host: str, speculative_config: dict) -> dict:
    """What the deployment record adds for a schedule: {"schedule_proof": latest_proof (None:
    deployed without a proof from this control node)}; nothing without a schedule, so every other
    record stays as it was."""
    schedule = speculative_config.get(SCHEDULE_KEY)
    if schedule is None:
        return {}
    return {"schedule_proof": latest_proof(root, host, schedule)}
