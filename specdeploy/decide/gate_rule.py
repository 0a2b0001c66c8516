"""The speculation gate's decision under the one decision rule (decisions.py): one-sided, against
max_tpot_ratio, on run-level TPOT of fresh-server runs; sequential looks; when a previous decision
must be re-examined. Pure functions: no host, no I/O (steps/gate.py runs the servers)."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from functools import lru_cache

from specdeploy.decide.decisions import (
    TOO_FEW_RUNS,
    _clean,
    _fmt_ratio,
    _interval,
    _sequential,
    summarize_values,
)
from specdeploy.decide.load_rule import (
    PROOF_RULE,
    SCHEDULE_KEY,
    proof_runs,
    prove_schedule,
    schedule_config,
)
from specdeploy.decide.stats import (
    DEFAULT_ALPHA,
    SEQUENTIAL_RULE,
    median,
    rank_test,
    sequential_looks,
)

GATE_MIN_RUNS = 2
GATE_RULE = (
    "exact one-sided permutation test on ranks of run-level TPOT (one value per fresh server "
    "start): the speculative runs divided by max_tpot_ratio against the baseline runs; kept only "
    "when p <= alpha, i.e. speculation is shown faster than max_tpot_ratio x baseline (the "
    "one-sided upper bound of the ratio is below max_tpot_ratio); the reverse test says whether a"
    " fall-back is conclusive"
)
BEST_PROVEN = "best_proven"  # on_fail: serve the best configuration proven faster, else baseline
GATE_PASSED = "faster than the margin"
GATE_SLOWER = "slower than the margin"
GATE_NOT_SHOWN = "not shown faster than the margin"


def gate_decision(
    spec_tpot: Sequence[float],
    base_tpot: Sequence[float],
    *,
    max_tpot_ratio: float,
    on_fail: str,
    alpha: float = DEFAULT_ALPHA,
) -> dict:
    """Keep speculation only when its run-level TPOT is significantly below max_tpot_ratio x the
    baseline's (GATE_RULE), from at least GATE_MIN_RUNS fresh-server runs per arm (the median TPOT
    of each run, decisions.run_values(runs, "tpot"); NOT per-request TPOTs).

    A false "keep" (speculation not faster than the margin, yet kept) happens with probability
    <= alpha; on identical arms much less. With 2 + 2 runs the one-sided test cannot go below
    1/6, so the verdict is "too few runs to decide at alpha" and speculation is not kept: use
    gate_next_step to add runs (3 + 3 reach 0.05). Returns the evidence to record: {passed,
    conclusive (the fall-back is itself significant: speculation slower than the margin), verdict,
    action, on_fail, max_tpot_ratio, alpha, p_value (faster than the margin), p_value_slower,
    min_p_value, runs, ratio, low/high (one-sided 1 - alpha bounds of the ratio), confidence,
    interval_method, speculative/baseline summaries, test, reason}."""
    if len(spec_tpot) < GATE_MIN_RUNS or len(base_tpot) < GATE_MIN_RUNS:
        raise ValueError(
            f"the gate needs at least {GATE_MIN_RUNS} fresh-server runs per arm (run-level TPOT), "
            f"got {len(spec_tpot)} speculative and {len(base_tpot)} baseline"
        )
    if median(base_tpot) <= 0:
        raise ValueError("the gate needs a positive baseline TPOT")
    n, m = len(spec_tpot), len(base_tpot)
    scaled = [x / max_tpot_ratio for x in spec_tpot]
    faster = rank_test(scaled, base_tpot, alternative="less")
    slower = rank_test(scaled, base_tpot, alternative="greater")
    upper = _interval(spec_tpot, base_tpot, alpha=alpha, side="upper")
    lower = _interval(spec_tpot, base_tpot, alpha=alpha, side="lower")
    min_p = faster["min_p_value"]
    passed = min_p <= alpha and faster["p_value"] <= alpha
    conclusive = passed or (min_p <= alpha and slower["p_value"] <= alpha)
    if passed:
        verdict = GATE_PASSED
    elif min_p > alpha:
        verdict = TOO_FEW_RUNS
    else:
        verdict = GATE_SLOWER if conclusive else GATE_NOT_SHOWN
    action = "keep speculative" if passed else _fall_back_action(on_fail)
    ratio = median(spec_tpot) / median(base_tpot)
    out = {
        "passed": passed,
        "conclusive": conclusive,
        "verdict": verdict,
        "action": action,
        "on_fail": on_fail,
        "max_tpot_ratio": max_tpot_ratio,
        "alpha": alpha,
        "p_value": faster["p_value"],
        "p_value_slower": slower["p_value"],
        "min_p_value": min_p,
        "runs": {"speculative": n, "baseline": m},
        "ratio": _clean(ratio),
        "low": lower["low"],
        "high": upper["high"],
        "confidence": upper["confidence"],
        "interval_method": upper["interval_method"] + " (one-sided bounds, each at 1 - alpha)",
        "speculative": summarize_values(list(spec_tpot)),
        "baseline": summarize_values(list(base_tpot)),
        "test": GATE_RULE,
    }
    out["reason"] = (
        f"{verdict}: median run TPOT speculative {median(spec_tpot):.3f} ms / baseline "
        f"{median(base_tpot):.3f} ms = {ratio:.3f} (upper bound {_fmt_ratio(out['high'])}), "
        f"{n} + {m} fresh-server runs; required <= {max_tpot_ratio}: p = "
        f"{faster['p_value']:.3g} (slower: {slower['p_value']:.3g}), alpha = {alpha:g}"
        + (
            f", the most extreme split gives p = {min_p:.3g}, so no data could pass"
            if verdict == TOO_FEW_RUNS
            else ""
        )
        + f" -> {action}"
    )
    return out


def gate_next_step(
    spec_tpot: Sequence[float],
    base_tpot: Sequence[float],
    *,
    max_tpot_ratio: float,
    on_fail: str,
    max_runs: int,
    alpha: float = DEFAULT_ALPHA,
    spending: str = "first-last",
) -> dict:
    """Sequential gate: "decide now" (result = gate_decision at this look's level, with the family
    alpha) or "add a run to each arm". One-sided looks (sequential_looks(alternative="less")): at
    alpha 0.05 the first is at 4 + 4 runs (level 1/70), so a large effect keeps speculation after 8
    server starts; it also stops early when the fall-back is conclusive (speculation significantly
    slower than the margin). At the budget's end without either, speculation is not kept (verdict
    "not shown faster than the margin", conclusive False). Each error (a false keep, a false
    conclusive fall-back) stays <= alpha over all looks."""
    looks = sequential_looks(max_runs, alpha=alpha, alternative="less", spending=spending)

    def at_look(level: float) -> tuple[dict, bool]:
        g = gate_decision(
            spec_tpot, base_tpot, max_tpot_ratio=max_tpot_ratio, on_fail=on_fail, alpha=level
        )
        g.update(alpha=alpha, look_alpha=level, test=f"{GATE_RULE}; {SEQUENTIAL_RULE}")
        if g["verdict"] == TOO_FEW_RUNS:
            g["verdict"] = GATE_NOT_SHOWN
        g["reason"] = g["reason"].replace(
            f"alpha = {level:g}", f"this look's level {level:.3g} (family alpha {alpha:g})"
        )
        g["reason"] = g["reason"].replace(TOO_FEW_RUNS, GATE_NOT_SHOWN, 1)
        return g, g["conclusive"]

    step = _sequential(
        spec_tpot,
        base_tpot,
        max_runs=max_runs,
        alpha=alpha,
        looks=looks,
        spending=spending,
        at_look=at_look,
        final=GATE_NOT_SHOWN,
    )
    return step


def gate_fingerprint(
    *,
    speculative_unit_sha256: str,
    baseline_unit_sha256: str,
    workload: Mapping,
    max_tpot_ratio: float,
    on_fail: str,
    alpha: float = DEFAULT_ALPHA,
    across_load: Mapping | None = None,
) -> dict:
    """What a gate decision depends on, to record with it (gate["fingerprint"]): both units (the
    vLLM version, argv and speculative config are in them), the workload (request set, rate,
    concurrency, sampling; digested) and the gate's own settings; `across_load` (the schedule, the
    fixed k, the load levels) only where the gate measures across load, so every other host's
    fingerprint stays as it was."""
    blob = json.dumps(workload, sort_keys=True, default=str).encode()
    extra = {"across_load": dict(across_load)} if across_load is not None else {}
    return {
        **extra,
        "speculative_unit_sha256": speculative_unit_sha256,
        "baseline_unit_sha256": baseline_unit_sha256,
        "workload_sha256": hashlib.sha256(blob).hexdigest(),
        "max_tpot_ratio": max_tpot_ratio,
        "on_fail": on_fail,
        "alpha": alpha,
    }


def gate_needs_recheck(
    previous_gate: Mapping | None,
    fingerprint: Mapping,
    *,
    now: datetime,
    recheck_days: float | None = None,
) -> dict:
    """Must the gate measure again, or may the previous decision stand? Returns {recheck, why}.

    Re-examine when there is no previous decision, when anything in `fingerprint`
    (gate_fingerprint) differs from the one recorded with it (workload or config changed), or, for
    a fall-back to the baseline, when it was decided `recheck_days` or more ago (None: never by
    age). previous_gate must carry "fingerprint" and "decided_at" (ISO 8601 with a time zone)."""
    if not previous_gate:
        return {"recheck": True, "why": "no previous gate decision"}
    old = previous_gate.get("fingerprint")
    if not old:
        return {"recheck": True, "why": "the previous gate decision has no fingerprint"}
    changed = sorted(k for k in set(old) | set(fingerprint) if old.get(k) != fingerprint.get(k))
    if changed:
        return {"recheck": True, "why": "changed since the previous gate: " + ", ".join(changed)}
    if previous_gate.get("passed"):
        return {"recheck": False, "why": "the previous gate passed with the same fingerprint"}
    decided = previous_gate.get("decided_at")
    if recheck_days is not None:
        if not decided:
            return {"recheck": True, "why": "the previous fall-back has no decided_at"}
        age = now - datetime.fromisoformat(decided)
        # compared as durations: days as a float quotient miss the boundary (0.007 days old read
        # as 0.006999...), and a fall-back exactly recheck_days old must re-measure
        if age >= timedelta(days=recheck_days):
            return {
                "recheck": True,
                "why": f"the fall-back was decided {age.total_seconds() / 86400:.1f} days ago "
                f"(gate_recheck_days = {recheck_days:g})",
            }
    return {
        "recheck": False,
        "why": "same units, workload and gate settings as the previous fall-back"
        + (f", decided {decided}" if decided else ""),
    }


# --------------------------------------------------------------------------------------------------
# One verdict per class of identical hosts (steps/gate.py): the canary's runs, and who may share

CLASS_EFFECT = 0.10  # the effect a class's canary is sized to find: 10 % below the margin
CLASS_POWER = 0.90


@lru_cache(maxsize=64)
def power_runs(
    cv: float,
    *,
    alpha: float = DEFAULT_ALPHA,
    effect: float = CLASS_EFFECT,
    power: float = CLASS_POWER,
    least: int = GATE_MIN_RUNS,
    most: int = 12,
    trials: int = 2000,
) -> dict:
    """Fresh-server runs per arm the gate needs to pass, with probability >= `power`, when
    speculation's run-level TPOT truly is `effect` below the margin (max_tpot_ratio x the
    baseline's), run-to-run spread `cv` (lognormal), under the gate's own test (GATE_RULE) at
    `alpha`. Monte Carlo, seeded: the same answer on every control node. Returns {runs, power
    (reached at runs), effect, cv, target_power, method}; `most` runs when even those fall short
    (the power reached says by how much)."""
    rng = random.Random(20261204)
    reached = 0.0
    for n in range(max(least, GATE_MIN_RUNS), most + 1):
        passed = 0
        for _ in range(trials):
            base = [rng.lognormvariate(0.0, cv) for _ in range(n)]
            # speculative / max_tpot_ratio, as the test scales it: (1 - effect) x a baseline run
            spec = [(1 - effect) * rng.lognormvariate(0.0, cv) for _ in range(n)]
            test = rank_test(spec, base, alternative="less")
            passed += test["p_value"] <= alpha and test["min_p_value"] <= alpha
        reached = passed / trials
        if reached >= power:
            break
    return {
        "runs": n,
        "power": round(reached, 3),
        "target_power": power,
        "effect": effect,
        "cv": cv,
        "method": f"{trials} simulated gates per n (seeded), lognormal run-level TPOT with this "
        "cv, speculative = max_tpot_ratio x (1 - effect) x baseline, the gate's own rank test",
    }


def smoke_outside_band(smoke: Mapping, band: Mapping) -> list[str]:
    """Why a host's smoke run is not like its class canary's (empty: it is): its median TPOT more
    than band["tolerance"] away from the canary's (relative), or its draft acceptance rate more
    than band["acceptance_tolerance"] away (absolute). A figure missing on either side counts as
    outside: sharing needs evidence the host is like its canary."""
    why = []
    tpot, own = band.get("smoke_tpot_ms"), smoke.get("median_tpot_ms")
    if not tpot or not own:
        why.append("no smoke TPOT to compare")
    elif abs(own / tpot - 1) > band["tolerance"]:
        why.append(f"smoke TPOT {own:.3f} ms vs the canary's {tpot:.3f} ms (outside "
                   f"+-{band['tolerance']:.0%})")  # fmt: skip
    rate, own_rate = band.get("acceptance_rate"), smoke.get("acceptance_rate")
    if (
        rate is not None
        and own_rate is not None
        and abs(own_rate - rate) > band["acceptance_tolerance"]
    ):
        why.append(f"acceptance {own_rate:.3f} vs the canary's {rate:.3f} (outside "
                   f"+-{band['acceptance_tolerance']:.2f})")  # fmt: skip
    return why


# --------------------------------------------------------------------------------------------------
# Across load (speculation_gate.across_load): a deployed schedule proven at every load level

ACROSS_LOAD_PASSED = "never slower than the baseline at any load level"
ACROSS_LOAD_SLOWER = "slower than the baseline at a load level"
ACROSS_LOAD_BEHIND = "slower than the fixed k at a load level"
ACROSS_LOAD_NOT_SHOWN = "not shown faster than the baseline at any load level"


def across_load_decision(
    runs: Mapping[int, Mapping[str, Sequence[float]]],
    *,
    schedule: Sequence[Sequence[int]],
    fixed_k: int,
    on_fail: str,
    alpha: float = DEFAULT_ALPHA,
) -> dict:
    """The gate's verdict on a deployed schedule from {concurrency: {"baseline", "schedule",
    "fixed": run-level TPOTs}}, by compare_across_load's own rule (load_rule.prove_schedule,
    PROOF_RULE): kept only when it is significantly faster than the baseline at one level at least,
    significantly slower than the baseline at none and slower than the fixed k at none. Else the
    host falls back to the baseline (or the deploy fails): the gate deploys nothing it did not
    measure winning, and the fixed k is a unit this host does not have; where the fixed k was
    proven instead, `instead` says what host data to set. Returns gate_decision's keys that the
    serve path reads (passed, conclusive, verdict, action, on_fail, alpha, runs, reason, test) and
    `across_load`: the per-level evidence."""
    for c, arms in runs.items():
        missing = {"baseline", "schedule", "fixed"} - {a for a, v in arms.items() if v}
        if missing:
            raise ValueError(f"concurrency {c}: no {', '.join(sorted(missing))} runs")
    fewest = min(len(v) for arms in runs.values() for v in arms.values()) if runs else 0
    if fewest < GATE_MIN_RUNS:
        raise ValueError(
            f"the across-load gate needs at least {GATE_MIN_RUNS} fresh-server runs per arm at "
            f"every level, got {fewest}"
        )
    proof = prove_schedule(runs, alpha=alpha)
    needed = proof_runs(len(runs), alpha)
    passed = proof["proven"]
    if passed:
        verdict = ACROSS_LOAD_PASSED
    elif fewest < needed:
        verdict = TOO_FEW_RUNS
    elif proof["slower_at"]:
        verdict = ACROSS_LOAD_SLOWER
    elif proof["behind_fixed_at"]:
        verdict = ACROSS_LOAD_BEHIND
    else:
        verdict = ACROSS_LOAD_NOT_SHOWN
    action = "keep the schedule" if passed else _fall_back_action(on_fail)
    instead = None
    alternatives = []
    if not passed and proof["fixed_proven"]:
        instead = (
            f"k = {fixed_k} without the schedule was faster than the baseline at concurrency "
            f"{', '.join(map(str, proof['fixed_faster_at']))} and slower at none: set "
            f"num_speculative_tokens = {fixed_k} and drop {SCHEDULE_KEY} to deploy it"
        )
        alternatives.append({"what": f"k = {fixed_k} without the schedule", "k": fixed_k,
                             "proven": True, "why": instead,
                             "faster_at": len(proof["fixed_faster_at"])})  # fmt: skip
    served = best_proven(alternatives) if not passed and on_fail == BEST_PROVEN else None
    if served is not None:
        action = f"serve {served['what']} (best proven)"
    levels = {
        c: {
            "tpot_ms": {arm: summarize_values(list(v)) for arm, v in runs[c].items()},
            **{key: _brief(proof["levels"][c][key]) for key in proof["levels"][c]},
        }
        for c in sorted(runs)
    }
    low_runs = (
        f"; {fewest} runs per arm cannot reach alpha / {len(runs)} (at least {needed})"
        if verdict == TOO_FEW_RUNS
        else ""
    )
    reason = f"{verdict}: {proof['verdict']}{low_runs} -> {action}" + (
        f" ({instead})" if instead else ""
    )
    if not passed and on_fail == BEST_PROVEN and served is None:
        reason += "; nothing else was proven faster than the baseline"
    return {
        "passed": passed,
        "conclusive": passed or bool(proof["slower_at"] or proof["behind_fixed_at"]),
        "verdict": verdict,
        "action": action,
        "on_fail": on_fail,
        "alpha": alpha,
        "runs": {"per_arm_per_level": fewest, "levels": len(runs)},
        "test": PROOF_RULE,
        "reason": reason,
        **({"served_instead": served} if served is not None else {}),
        "across_load": {
            "schedule": [list(e) for e in schedule],
            "fixed_k": fixed_k,
            "level_alpha": proof["level_alpha"],
            "slower_at": proof["slower_at"],
            "behind_fixed_at": proof["behind_fixed_at"],
            "faster_at": proof["faster_at"],
            "fixed_proven": proof["fixed_proven"],
            "proof_decision": proof["decision"],
            "instead": instead,
            "levels": levels,
        },
    }


def _fall_back_action(on_fail: str) -> str:
    if on_fail == "fail":
        return "fail the deploy"
    return "switch to baseline"  # best_proven: unless an alternative was proven (the caller)


def best_proven(alternatives: Sequence[Mapping]) -> dict | None:
    """on_fail = "best_proven": of the configurations the gate's runs proved faster than the
    baseline (and slower nowhere), the one faster at the most load levels (ties: the first
    listed); None when none was, so the host falls back to the baseline."""
    proven = [a for a in alternatives if a.get("proven")]
    if not proven:
        return None
    return dict(max(proven, key=lambda a: a.get("faster_at", 0)))


def served_config(speculative_config: Mapping, decision: Mapping) -> dict | None:
    """The speculative_config a best_proven fall-back serves (decision["served_instead"]), or
    None when it serves the baseline."""
    served = decision.get("served_instead")
    if not served:
        return None
    return schedule_config(speculative_config, None, served["k"])


def _brief(comparison: Mapping | None) -> dict | None:
    """A comparison as the record keeps it: the figures and the verdict, not the rule's prose."""
    if comparison is None:
        return None
    keep = ("verdict", "ratio", "low", "high", "confidence", "p_value")
    return {key: comparison.get(key) for key in keep}
