"""The report of a measurement across load levels (issue 39), built only from the raw files like
every report: a load tune (tune_method = "load": a k per level, the schedule they call for, the
single k or "off" where the release has no schedule) and the proof of a schedule
(compare_across_load: the schedule against the baseline and the fixed k at every level)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from specdeploy.config import datasets
from specdeploy.config.schema import ServeConfig
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

PROOFS = "proofs"  # under the reports root: one kept proof per fingerprint


def proof_fingerprint(
    cfg: ServeConfig, hardware: dict, speculative_config: Mapping | None = None
) -> dict:
    """What a schedule's proof depends on, and so what a deploy must match to count it: the
    release, the target and the draft at their revisions (the commits the control node pinned),
    the speculative config with its schedule (`speculative_config`: a candidate measured before it
    was deployed), the workload with its load levels, the request set's sha256 and the hardware
    (checks/preflight.hardware: the class of identical hosts)."""
    w = cfg.workload
    described = datasets.describe(w.dataset_path, w.dataset) or {}
    spec = dict(cfg.speculative_config if speculative_config is None else speculative_config)
    return {
        "release": {"package": cfg.vllm_package, "version": cfg.vllm_version},
        "target": {"model": cfg.target_model, "revision": cfg.target_revision},
        "draft": {"model": cfg.draft_model, "revision": cfg.draft_revision},
        "speculative_config": json.loads(json.dumps(spec)),  # tuples read back as lists
        "workload": w.model_dump(mode="json"),
        "request_set_sha256": described.get("sha256"),
        "hardware": hardware,
    }


def proof_key(fingerprint: Mapping) -> str:
    """The kept proof's name: 16 hex digits of the fingerprint's sha256."""
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]


def _evidence(run: str | None, name: str, h: dict) -> dict:
    """One host's proof as a record keeps it: {run, measured_on, finished_at, proven, decision,
    verdict, alpha, level_alpha, levels {concurrency: {ratio, low, high, verdict} of the schedule
    against the baseline}, proven_range}."""
    proof = h["proof"]
    levels = {
        c: {key: lv["vs_baseline"][key] for key in ("ratio", "low", "high", "verdict")}
        for c, lv in proof["levels"].items()
    }
    keep = ("proven", "decision", "verdict", "alpha", "level_alpha")
    return {"run": run, "measured_on": name, "finished_at": h["conditions"].get("finished_at"),
            **{key: proof[key] for key in keep}, "levels": levels,
            "proven_range": h.get("proven_range")}  # fmt: skip


def keep_proofs(run_dir: Path, summary: dict) -> list[Path]:
    """After a proof's report (flows/measure.py, the flow that measured it): each host's proof of
    a schedule kept as <reports root>/proofs/<proof_key>.json with the fingerprint its conditions
    carry; a proof without one (made before fingerprints) is not kept. A proof of the same
    fingerprint that finished later stays (by the time it records, never a file's)."""
    kept = []
    for name, h in (summary.get("hosts") or {}).items():
        fingerprint = (h.get("conditions") or {}).get("proof_fingerprint")
        if "proof" not in h or not h.get("schedule") or not fingerprint:
            continue
        entry = {"key": proof_key(fingerprint), "fingerprint": fingerprint,
                 **_evidence(summary.get("run"), name, h)}  # fmt: skip
        path = Path(run_dir).parent / PROOFS / f"{entry['key']}.json"
        if keep_entry(path, entry):
            kept.append(path)
    return kept


def keep_entry(path: Path, entry: dict) -> bool:
    """Evidence kept by its fingerprint's key (a schedule's proof, a draft choice): written
    atomically unless the one there finished later (by the time it records, never a file's)."""
    there = _read(path)
    if there and (there.get("finished_at") or "") > (entry["finished_at"] or ""):
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(entry, indent=1, sort_keys=True) + "\n")
    os.replace(partial, path)  # a reader sees the old entry or the new one, whole
    return True


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def kept_proof(root: Path, fingerprint: Mapping, folder: str = PROOFS) -> dict | None:
    """The proof (or other evidence, `folder`) kept under the reports root `root` for exactly
    `fingerprint`, else None."""
    entry = _read(Path(root) / folder / f"{proof_key(fingerprint)}.json")
    return entry if entry and entry.get("fingerprint") == fingerprint else None


def kept_proof_of(root: Path, cfg: ServeConfig, host: str) -> dict | None:
    """For the alerts (`specdeploy render`, which reads no host's facts): the kept proof whose
    fingerprint matches `cfg` in everything host data decides (all but the hardware), one measured
    on `host` first, then the one that finished last (by the time it records); None: none kept."""
    want = {k: v for k, v in proof_fingerprint(cfg, {}).items() if k != "hardware"}
    found = []
    for path in sorted((Path(root) / PROOFS).glob("*.json")):
        entry = _read(path)
        fingerprint = (entry or {}).get("fingerprint") or {}
        if {k: v for k, v in fingerprint.items() if k != "hardware"} == want:
            found.append(entry)
    found.sort(key=lambda e: (e.get("measured_on") == host, e.get("finished_at") or ""))
    return found[-1] if found else None
