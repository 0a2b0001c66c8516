"""Decisions over measured samples: per-arm summaries, speculative/baseline ratios, the choice of
num_speculative_tokens and the speculation gate. Pure functions: no host, no I/O.

The statistical unit everywhere (compare, tune, the gate) is ONE benchmark run against a freshly
restarted server: each run contributes one value per metric (that run's median TTFT/TPOT/ITL/E2E
latency, its output throughput). Requests inside one run share one server start and are not
independent samples of the arm, so they are never pooled, and never decide (on the H200 the
speculative TPOT swings up to 1.7x between starts while requests of one start agree).

One decision rule (issue 22): the exact permutation test on ranks of the run-level values
(stats.rank_test) at alpha (DEFAULT_ALPHA, host data `decision_alpha`), with its false-verdict rate
<= alpha: compare_values (fixed runs), next_step (sequential: add runs until it can decide or the
budget is spent), choose_k (with a baseline arm: "leave speculation off" is an answer),
gate_decision and gate_next_step (one-sided, against max_tpot_ratio). "no significant difference"
and "too few runs to decide at alpha" are verdicts. The effect is the ratio of medians with the
rank-test inversion interval (stats.ratio_interval). Run order: run_order / round_order. Fleet:
fleet_ratio (median of per-host ratios). Calibration: benchmarks/decision_rule.py and
tests/unit/test_decision_rule.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Mapping, Sequence
from datetime import datetime

from ..metrics import pooled_per_position_acceptance
from .stats import (
    RATIO_INTERVAL_METHOD,
    attained_level,
    mad,
    median,
    min_p_value,
    min_runs_per_arm,
    rank_test,
    ratio_interval,
    sign_test,
)

# name -> (key in the `vllm bench serve` result JSON, label, unit, lower_is_better)
METRICS: dict[str, tuple[str, str, str, bool]] = {
    "ttft": ("median_ttft_ms", "TTFT (time to first token)", "ms", True),
    "tpot": ("median_tpot_ms", "TPOT (time per output token, excl. first)", "ms", True),
    "itl": ("median_itl_ms", "ITL (gap between streamed chunks)", "ms", True),
    "e2el": ("median_e2el_ms", "E2E request latency", "ms", True),
    "output_throughput": ("output_throughput", "output throughput", "tok/s", False),
    "request_throughput": ("request_throughput", "request throughput", "req/s", False),
}

ITL_NOTE = (
    "ITL and TPOT are different numbers under speculation: TPOT is (E2E latency - TTFT) / "
    "(output tokens - 1), the cost per generated token; ITL is the gap between streamed chunks, "
    "and one chunk can carry several accepted tokens, so ITL can rise while TPOT falls. Judge "
    "speculation by TPOT and E2E latency, not by ITL. A baseline ITL median near 0 ms means its "
    "tokens reached the client coalesced in chunks; the ITL ratio is then huge and meaningless."
)
TEXT_NOTE = (
    "Identical generated text is not used as a pass/fail signal anywhere: with temperature 0 "
    "speculation is designed not to change the output, so equal text proves nothing about speed, "
    "and unequal text can come from batching nondeterminism."
)


def _clean(x: float | None) -> float | None:
    """JSON-safe float: inf/nan become None."""
    if x is None or not isinstance(x, (int, float)) or math.isnan(x) or math.isinf(x):
        return None
    return float(x)


def run_values(runs: Sequence[Mapping], metric: str) -> list[float]:
    """One value per run for `metric` (see METRICS), from raw bench result dicts; runs without it
    are skipped."""
    key = METRICS[metric][0]
    return [float(r[key]) for r in runs if isinstance(r.get(key), (int, float))]


def summarize_values(values: Sequence[float]) -> dict:
    if not values:
        return {"n": 0, "median": None, "mad": None, "values": []}
    return {
        "n": len(values),
        "median": median(values),
        "mad": mad(values),
        "values": [float(v) for v in values],
    }


def arm_summary(runs: Sequence[Mapping]) -> dict[str, dict]:
    """{metric: {n, median, mad, values}} for one arm's runs."""
    return {metric: summarize_values(run_values(runs, metric)) for metric in METRICS}


# --- the decision rule (issue 22): one exact test on run-level values -----------------------------

DEFAULT_ALPHA = 0.05  # host data `decision_alpha` once wired
BETTER, WORSE = "better", "worse"
NO_DIFFERENCE = "no significant difference"
TOO_FEW_RUNS = "too few runs to decide at alpha"
NOT_COMPARABLE = "not comparable"
VERDICTS = (BETTER, WORSE, NO_DIFFERENCE, TOO_FEW_RUNS, NOT_COMPARABLE)
RULE = (
    "exact two-sided permutation test on ranks (Wilcoxon-Mann-Whitney) of run-level values, one "
    "value per fresh server start, every C(n+m, n) split of the runs counted; 'better'/'worse' "
    "only when p <= alpha; 'too few runs to decide at alpha' when even the most extreme split (p "
    "= 2/C(n+m, n)) cannot reach alpha"
)


def compare_values(
    spec: Sequence[float],
    base: Sequence[float],
    *,
    lower_is_better: bool = True,
    alpha: float = DEFAULT_ALPHA,
) -> dict:
    """The verdict on the speculative arm against the baseline, from run-level values (one value per
    run on a fresh server; see the module docstring), by the one decision rule (RULE).

    Returns {verdict (one of VERDICTS), significant, p_value, min_p_value, alpha, runs
    {speculative, baseline}, ratio (median spec / median base), low, high, confidence,
    interval_method (stats.ratio_interval at 1 - alpha; where the runs are too few for that, the
    widest interval they give with its own confidence, e.g. 90 % at 3 + 3),
    test (RULE), reason (one sentence with the numbers)}; "not comparable" adds `why` (no runs, or a
    baseline median <= 0). The verdict and the interval agree: "better"/"worse" exactly when the
    interval excludes 1 (ties aside)."""
    n, m = len(spec), len(base)
    why = None
    if not spec or not base:
        why = "no samples"
    elif median(base) <= 0:
        why = f"baseline median is {median(base)}"
    if why:
        return {
            "ratio": None,
            "low": None,
            "high": None,
            "significant": False,
            "verdict": NOT_COMPARABLE,
            "why": why,
            "alpha": alpha,
            "runs": {"speculative": n, "baseline": m},
            "test": RULE,
            "reason": f"not comparable: {why}",
        }
    test = rank_test(spec, base, alternative="two-sided")
    p, min_p = test["p_value"], test["min_p_value"]
    ratio = median(spec) / median(base)
    interval = _interval(spec, base, alpha=alpha, side="two-sided")
    if min_p > alpha:
        verdict, significant = TOO_FEW_RUNS, False
    elif p <= alpha:
        significant = True
        spec_lower = test["u"] < n * m / 2  # the test's own direction (ranks), not the medians'
        verdict = BETTER if spec_lower == lower_is_better else WORSE
    else:
        verdict, significant = NO_DIFFERENCE, False
    out = {
        "verdict": verdict,
        "significant": significant,
        "p_value": p,
        "min_p_value": min_p,
        "alpha": alpha,
        "runs": {"speculative": n, "baseline": m},
        "ratio": _clean(ratio),
        **interval,
        "test": RULE,
    }
    out["reason"] = _reason(out)
    return out


def _interval(spec, base, *, alpha: float, side: str) -> dict:
    """stats.ratio_interval as the fields decisions return (None bounds for non-positive values)."""
    if min(spec) < 0 or min(base) <= 0:  # a baseline run at 0 (e.g. ITL): the ratio is unbounded
        return {
            "low": 0.0,
            "high": None,
            "confidence": None,
            "interval_method": RATIO_INTERVAL_METHOD + " (unbounded: a baseline run value <= 0)",
        }
    iv = ratio_interval(spec, base, alpha=alpha, side=side, widest_if_unreachable=True)
    method = iv["method"]
    if not iv["reached"]:
        method += f" (too few runs for {1 - alpha:.1%}: the widest interval these runs give)"
    return {
        "low": _clean(iv["low"]),
        "high": _clean(iv["high"]),
        "confidence": iv["confidence"],
        "interval_method": method,
    }


def _fmt_ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def _reason(r: Mapping) -> str:
    runs = f"{r['runs']['speculative']} + {r['runs']['baseline']} runs (speculative + baseline)"
    conf = "" if r["confidence"] is None else f" {r['confidence']:.1%}"
    interval = (
        f"{conf} interval {_fmt_ratio(r['low'])}-{_fmt_ratio(r['high'])}"
        if r["low"] is not None or r["high"] is not None
        else " no interval at this alpha"
    )
    head = f"ratio {_fmt_ratio(r['ratio'])} ({interval.strip()}), {runs}"
    if r["verdict"] == TOO_FEW_RUNS:
        return (
            f"{TOO_FEW_RUNS}: {head}; the most extreme split of these runs gives p = "
            f"{r['min_p_value']:.3g} > alpha = {r['alpha']:g}, so no data could decide "
            f"(at least {min_runs_per_arm(r['alpha'])} runs per arm are needed)"
        )
    sign = "<=" if r["significant"] else ">"
    return f"{r['verdict']}: {head}; p = {r['p_value']:.3g} {sign} alpha = {r['alpha']:g}"


# --- sequential: add runs until the rule can decide or the budget is spent ------------------------

SEQUENTIAL_RULE = (
    "sequential looks at equal run counts per arm; the first look is at the fewest runs at which "
    "the exact test can go below alpha and spends only its most extreme split (2/70 = 0.029 at 4 "
    "+ 4 runs for alpha = 0.05, two-sided); the rest of alpha goes to the look at the run budget "
    "(spending 'first-last', the default) or is split evenly over every run count after the first"
    " ('even'), each look's unspent share (the exact test's p-values are discrete) carried to the"
    " next. The levels actually spent add up to <= alpha, so by the union bound the chance of any"
    " false verdict over all looks is <= alpha whatever the dependence between looks (Bonferroni "
    "over looks with carry-forward)"
)


SPENDING = ("even", "first-last")


def sequential_looks(
    max_runs: int,
    *,
    alpha: float = DEFAULT_ALPHA,
    alternative: str = "two-sided",
    spending: str = "first-last",
) -> list[dict]:
    """The looks of the sequential rule (SEQUENTIAL_RULE) for a budget of max_runs runs per arm:
    [{runs, level (the p-value threshold at that look), spent (the false-verdict probability it
    spends: the largest achievable p <= level)}]. Looks whose level no split can reach are left
    out (their share carries on). Empty when the budget cannot reach alpha at all.

    spending "first-last" (the default): two looks only, the first and the budget's end, which
    gets all the rest of alpha; "even": the rest split evenly over every later run count (stops a
    little earlier on medium effects, less power at the budget: at 8 runs per arm and a 10 %
    effect with CV 5 %, 82 % against 93 %; benchmarks/decision_rule.py compares them)."""
    if spending not in SPENDING:
        raise ValueError(f"spending must be one of {SPENDING}")
    first = min_runs_per_arm(alpha, alternative=alternative)
    while first < max_runs and min_p_value(first, first, alternative=alternative) >= alpha:
        first += 1  # a first look at exactly alpha would leave nothing for the later ones
    if max_runs < first:
        return []
    if max_runs == first:  # one look: the fixed-size test
        return [
            {
                "runs": first,
                "level": alpha,
                "spent": attained_level(first, first, alpha, alternative=alternative),
            }
        ]
    first_level = min_p_value(first, first, alternative=alternative)
    looks = [{"runs": first, "level": first_level, "spent": first_level}]
    left = alpha - first_level
    later = list(range(first + 1, max_runs + 1)) if spending == "even" else [max_runs]
    for i, n in enumerate(later):
        level = left / (len(later) - i)
        spent = attained_level(n, n, level, alternative=alternative)
        left -= spent
        if spent > 0:
            looks.append({"runs": n, "level": level, "spent": spent})
    if looks[-1]["runs"] != max_runs:  # the budget's end is always a look (it may never stop)
        looks.append({"runs": max_runs, "level": 0.0, "spent": 0.0})
    return looks


ADD_RUN = "add a run to each arm"
DECIDE = "decide now"


def next_step(
    spec: Sequence[float],
    base: Sequence[float],
    *,
    max_runs: int,
    alpha: float = DEFAULT_ALPHA,
    lower_is_better: bool = True,
    spending: str = "first-last",
) -> dict:
    """Sequential compare: given the run-level values so far (equal counts per arm) and a budget of
    max_runs runs per arm, "decide now" (with the verdict) or "add a run to each arm".

    Stops at the first look (4 + 4 runs at alpha 0.05) when every speculative run beats every
    baseline run (the trained sandbox pair, ratio 0.46), and spends the budget only on close calls;
    at the budget's end without significance the verdict is "no significant difference". Returns
    {action, runs_per_arm, max_runs, alpha, looks, spending, look (this look or None), result
    (compare_values at this look's level, with the family alpha; None between looks), rule,
    reason}."""
    looks = sequential_looks(max_runs, alpha=alpha, spending=spending)
    return _sequential(
        spec,
        base,
        max_runs=max_runs,
        alpha=alpha,
        looks=looks,
        spending=spending,
        at_look=lambda level: _compare_at_look(spec, base, level, alpha, lower_is_better),
        final=NO_DIFFERENCE,
    )


def _compare_at_look(spec, base, level, alpha, lower_is_better) -> tuple[dict, bool]:
    r = compare_values(spec, base, lower_is_better=lower_is_better, alpha=level)
    r.update(alpha=alpha, look_alpha=level, test=f"{RULE}; {SEQUENTIAL_RULE}")
    if r["verdict"] == TOO_FEW_RUNS:
        r["verdict"] = NO_DIFFERENCE
    r["reason"] = (
        f"{r['verdict']}: p = {r['p_value']:.3g} {'<=' if r['significant'] else '>'} this "
        f"look's level {level:.3g} (family alpha {alpha:g} over the looks), ratio "
        f"{_fmt_ratio(r['ratio'])} ({_fmt_ratio(r['low'])}-{_fmt_ratio(r['high'])}), "
        f"{r['runs']['speculative']} + {r['runs']['baseline']} runs"
    )
    return r, r["significant"]


def _sequential(spec, base, *, max_runs, alpha, looks, spending, at_look, final) -> dict:
    n, m = len(spec), len(base)
    out = {
        "runs_per_arm": {"speculative": n, "baseline": m},
        "max_runs": max_runs,
        "alpha": alpha,
        "looks": looks,
        "spending": spending,
        "look": None,
        "result": None,
        "rule": SEQUENTIAL_RULE,
    }
    if not looks:
        need = min_runs_per_arm(alpha)
        raise ValueError(
            f"a budget of {max_runs} runs per arm can never reach alpha = {alpha:g}: "
            f"at least {need} needed"
        )
    if n > max_runs or m > max_runs:
        raise ValueError(f"more runs ({n}, {m}) than the budget of {max_runs} per arm")
    if n != m:
        short = "speculative" if n < m else "baseline"
        return {
            **out,
            "action": f"add a run to the {short} arm",
            "reason": f"unequal arms ({n} speculative, {m} baseline): looks are at equal counts",
        }
    look = next((lk for lk in looks if lk["runs"] == n), None)
    if look is None:
        nxt = next((lk["runs"] for lk in looks if lk["runs"] > n), max_runs)
        return {
            **out,
            "action": ADD_RUN,
            "reason": f"{n} runs per arm: the next look is at {nxt} runs per arm",
        }
    result, stop = at_look(look["level"])
    out.update(look=look, result=result)
    if stop:
        return {**out, "action": DECIDE, "reason": result["reason"]}
    if n == max_runs:
        result["verdict"] = final
        result["reason"] = f"{result['reason']}; the run budget ({max_runs} per arm) is spent"
        return {**out, "action": DECIDE, "reason": result["reason"]}
    return {
        **out,
        "action": ADD_RUN,
        "reason": f"not decided at {n} runs per arm ({result['reason']}); budget {max_runs}",
    }


# --- run order ------------------------------------------------------------------------------------

RUN_ORDER_MODES = ("random", "alternate")


def round_order(
    arms: Sequence[str], round_index: int, *, seed: int | None, mode: str = "random"
) -> list[str]:
    """The order of the arms in round `round_index` (each arm once per round): "alternate" rotates
    the arms by one each round (A B, B A, A B, ... for two arms: no arm always first); "random"
    shuffles each round with a generator seeded by (seed, round), so a sequential run can add
    rounds and the whole order is rebuilt from the recorded seed."""
    arms = list(arms)
    if mode == "alternate":
        shift = round_index % len(arms)
        return arms[shift:] + arms[:shift]
    if mode != "random":
        raise ValueError(f"mode must be one of {RUN_ORDER_MODES}")
    if seed is None:
        raise ValueError("a random run order needs its seed (run_order draws and records one)")
    rng = random.Random(f"specdeploy-run-order:{seed}:{round_index}")
    rng.shuffle(arms)
    return arms


def run_order(
    arms: Sequence[str], rounds: int, *, seed: int | None = None, mode: str = "random"
) -> dict:
    """The order of `rounds` rounds over `arms` (blocked: every arm once per round, so slow drift
    of the host hits all arms alike), never the baseline first every time. With mode="random" and
    no seed, a seed is drawn and returned: record {mode, seed} with the runs. Returns {order (arm
    names, rounds * len(arms)), rounds, mode, seed}."""
    if not arms or len(set(arms)) != len(arms):
        raise ValueError("arms must be distinct and non-empty")
    if mode == "random" and seed is None:
        seed = random.SystemRandom().randrange(2**32)
    order = [a for r in range(rounds) for a in round_order(arms, r, seed=seed, mode=mode)]
    return {
        "order": order,
        "rounds": rounds,
        "mode": mode,
        "seed": seed if mode == "random" else None,
    }


# --- fleet: the median of paired per-host ratios --------------------------------------------------


def fleet_ratio(per_host_ratio: Mapping[str, float | None]) -> dict:
    """The fleet-wide figure from each host's own ratio (median spec / median base of that host's
    runs: paired within the host), never from runs of different hosts pooled. Returns {ratio (the
    median of the per-host ratios), min, max, mad, hosts, per_host, sign_test (exact two-sided sign
    test of "the median host ratio is 1": p_value, below, above), how}; hosts without a ratio are
    listed under `left_out`."""
    kept = {h: float(r) for h, r in per_host_ratio.items() if r is not None and r > 0}
    left_out = sorted(h for h in per_host_ratio if h not in kept)
    how = (
        "median of per-host ratios (each host's speculative median over its own baseline median, "
        "run-level values); spread = min/max and MAD over hosts; sign test over hosts"
    )
    if not kept:
        return {"ratio": None, "hosts": 0, "per_host": {}, "left_out": left_out, "how": how}
    values = list(kept.values())
    return {
        "ratio": median(values),
        "min": min(values),
        "max": max(values),
        "mad": mad(values),
        "hosts": len(values),
        "per_host": kept,
        "left_out": left_out,
        "sign_test": sign_test(values, center=1.0),
        "how": how,
    }


def compare_arms(spec_runs: Sequence[Mapping], base_runs: Sequence[Mapping]) -> dict[str, dict]:
    """{metric: ratio/band/verdict} of the speculative arm over the baseline arm, run-level
    values."""
    return {
        metric: compare_values(
            run_values(spec_runs, metric), run_values(base_runs, metric), lower_is_better=lower
        )
        for metric, (_, _, _, lower) in METRICS.items()
    }


def acceptance_summary(counters: Sequence[Mapping]) -> dict:
    """Pooled acceptance over runs from server counter deltas ({drafts, draft_tokens,
    accepted_tokens} as metrics.acceptance returns them): rate = sum(accepted)/sum(draft tokens),
    mean acceptance length = 1 + sum(accepted)/sum(drafts); plus the per-run rates' median."""
    drafts = sum(c.get("drafts") or 0 for c in counters)
    proposed = sum(c.get("draft_tokens") or 0 for c in counters)
    accepted = sum(c.get("accepted_tokens") or 0 for c in counters)
    rates = [c["acceptance_rate"] for c in counters if c.get("acceptance_rate") is not None]
    lengths = [
        c["mean_acceptance_length"] for c in counters if c.get("mean_acceptance_length") is not None
    ]
    return {
        "runs": len(counters),
        "drafts": drafts,
        "draft_tokens": proposed,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / proposed if proposed else None,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        "per_run_acceptance_rate": summarize_values(rates),
        "per_run_mean_acceptance_length": summarize_values(lengths),
        "per_position": pooled_per_position_acceptance(list(counters)),
    }


# --- num_speculative_tokens -----------------------------------------------------------------------

CHOOSE_K_RULE = (
    "best = the k with the lowest median TPOT; a k is 'significantly slower than the best' when "
    "the exact one-sided rank test of its runs against the best's gives p <= alpha/(K-1) "
    "(Bonferroni over the K-1 comparisons); a k is 'significantly faster than the baseline' when "
    "the one-sided test against the baseline arm passes Holm's step-down procedure at alpha over "
    "the K k values. Recommended: the smallest k that is faster than the baseline and not slower "
    "than the best; 'leave speculation off' when no k is faster than the baseline. False verdicts"
    " on identical arms: a k other than the smallest is recommended only if the smallest k is "
    "wrongly found slower than the best (<= alpha by the union bound), speculation is recommended"
    " only if some k is wrongly found faster than the baseline (<= alpha, Holm)"
)
OFF = "leave speculation off"


def choose_k(
    tpot_by_k: Mapping[int, Sequence[float]],
    *,
    baseline: Sequence[float] | None = None,
    alpha: float = DEFAULT_ALPHA,
) -> dict:
    """Recommend num_speculative_tokens from run-level TPOT (one value per fresh-server run) by the
    one decision rule (CHOOSE_K_RULE), or "leave speculation off".

    tpot_by_k: {k: runs}; the baseline arm is `baseline`, or tpot_by_k[0] (tune_flow labels the
    baseline k = 0). Without a baseline arm the choice is among the k only and `speculation` is
    "not measured". Returns {best_k, recommended_k (None when off), speculation ("on", "off", "not
    measured"), verdict (a sentence with the numbers), alpha, rule, per_k {k: {n, median, mad,
    values, ratio_to_best, p_slower_than_best, slower_than_best, within_noise_of_best (= not
    slower; the old key), ratio_to_baseline, p_faster_than_baseline, faster_than_baseline}},
    baseline (its summary or None), levels {vs_best, vs_baseline_first}, reachable {vs_best,
    vs_baseline} (False: too few runs for any comparison of that kind to reach its level)}."""
    runs = {k: list(v) for k, v in tpot_by_k.items() if v}
    if baseline is None and 0 in runs:
        baseline = runs.pop(0)
    runs.pop(0, None)
    ks = sorted(runs)
    if not ks:
        raise ValueError("no TPOT samples for any k")
    base = list(baseline) if baseline else None
    best = min(ks, key=lambda k: (median(runs[k]), k))
    big_k = len(ks)
    level_best = alpha / (big_k - 1) if big_k > 1 else alpha
    per_k: dict[int, dict] = {}
    for k in ks:
        vs_best = rank_test(runs[k], runs[best], alternative="greater") if k != best else None
        slower = vs_best is not None and vs_best["p_value"] <= level_best
        per_k[k] = {
            **summarize_values(runs[k]),
            "ratio_to_best": _clean(median(runs[k]) / median(runs[best])),
            "p_slower_than_best": vs_best["p_value"] if vs_best else None,
            "slower_than_best": slower,
            "within_noise_of_best": not slower,
            "ratio_to_baseline": None,
            "p_faster_than_baseline": None,
            "faster_than_baseline": None,
        }
    reachable_best = big_k == 1 or any(
        min_p_value(len(runs[k]), len(runs[best]), alternative="greater") <= level_best
        for k in ks
        if k != best
    )
    out = {
        "best_k": best,
        "alpha": alpha,
        "rule": CHOOSE_K_RULE,
        "per_k": per_k,
        "baseline": summarize_values(base) if base else None,
        "levels": {"vs_best": level_best, "vs_baseline_first": alpha / big_k},
    }
    not_slower = [k for k in ks if not per_k[k]["slower_than_best"]]
    if base is None:
        rec = min(not_slower)
        return {
            **out,
            "recommended_k": rec,
            "speculation": "not measured",
            "reachable": {"vs_best": reachable_best, "vs_baseline": None},
            "verdict": f"k = {rec}: the smallest k not significantly slower than the best "
            f"(k = {best}) at alpha = {alpha:g}; no baseline arm, so whether speculation pays "
            "off at all is not tested",
        }
    pvals = {}
    for k in ks:
        t = rank_test(runs[k], base, alternative="less")
        pvals[k] = t["p_value"]
        per_k[k]["ratio_to_baseline"] = _clean(median(runs[k]) / median(base))
        per_k[k]["p_faster_than_baseline"] = t["p_value"]
    faster = _holm(pvals, alpha)
    for k in ks:
        per_k[k]["faster_than_baseline"] = k in faster
    reachable_base = any(
        min_p_value(len(runs[k]), len(base), alternative="less") <= alpha / big_k for k in ks
    )
    out["reachable"] = {"vs_best": reachable_best, "vs_baseline": reachable_base}
    if not faster:
        why = (
            f"{TOO_FEW_RUNS}: with these runs no k can be shown faster than the baseline at "
            f"alpha = {alpha:g} over {big_k} k (Holm: smallest p must be <= {alpha / big_k:.3g})"
            if not reachable_base
            else f"no k is significantly faster than the baseline (smallest p = "
            f"{min(pvals.values()):.3g}, k = {min(pvals, key=pvals.get)}; Holm at "
            f"alpha = {alpha:g} over {big_k} k)"
        )
        return {**out, "recommended_k": None, "speculation": "off", "verdict": f"{OFF}: {why}"}
    candidates = [k for k in not_slower if k in faster]
    rec = min(candidates) if candidates else min(faster, key=lambda k: (median(runs[k]), k))
    v = per_k[rec]
    return {
        **out,
        "recommended_k": rec,
        "speculation": "on",
        "verdict": f"k = {rec}: significantly faster than the baseline (TPOT ratio "
        f"{_fmt_ratio(v['ratio_to_baseline'])}, p = {v['p_faster_than_baseline']:.3g}, Holm at "
        f"alpha = {alpha:g}) and the smallest such k not significantly slower than the best "
        f"(k = {best}; level {level_best:.3g} per comparison)",
    }


def _holm(pvals: Mapping[int, float], alpha: float) -> set[int]:
    """Holm's step-down: the keys whose null is rejected with family-wise error <= alpha."""
    rejected = set()
    ordered = sorted(pvals, key=lambda k: (pvals[k], k))
    for i, k in enumerate(ordered):
        if pvals[k] <= alpha / (len(ordered) - i):
            rejected.add(k)
        else:
            break
    return rejected


def min_runs_for_choose_k(num_k: int, *, alpha: float = DEFAULT_ALPHA) -> int:
    """The fewest runs per arm (k arms and the baseline alike) at which choose_k can find any k
    faster than the baseline (one-sided level alpha/num_k): 4 for 1-3 k at alpha 0.05, 5 for
    4-15 k (the 7-k sweep)."""
    return min_runs_per_arm(alpha / num_k, alternative="less")


def host_data_change(host: str, speculative_config: Mapping, k: int) -> str:
    """The host-data line to set (printed by deploys/tune.py; it never edits group_data itself)."""
    new = {**speculative_config, "num_speculative_tokens": k}
    return f"host_data/{host}: speculative_config = {dict(sorted(new.items()))!r}"


# --- the speculation gate -------------------------------------------------------------------------


def per_request_tpot_ms(result: Mapping) -> list[float]:
    """Per-request TPOT (ms) from a `--save-detailed` bench result, as vLLM's bench computes it:
    (latency - ttft) / (output_len - 1) for requests with more than one output token. Descriptive
    only (predict.py, reports): requests of one run share one server start, so the gate never
    decides on them."""
    out = []
    for latency, ttft, n in zip(
        result.get("latencies") or [],
        result.get("ttfts") or [],
        result.get("output_lens") or [],
        strict=False,
    ):
        if n and n > 1 and latency is not None and ttft is not None:
            out.append((latency - ttft) / (n - 1) * 1000.0)
    return out


GATE_MIN_RUNS = 2
GATE_RULE = (
    "exact one-sided permutation test on ranks of run-level TPOT (one value per fresh server "
    "start): the speculative runs divided by max_tpot_ratio against the baseline runs; kept only "
    "when p <= alpha, i.e. speculation is shown faster than max_tpot_ratio x baseline (the "
    "one-sided upper bound of the ratio is below max_tpot_ratio); the reverse test says whether a"
    " fall-back is conclusive"
)
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
    action = (
        "keep speculative"
        if passed
        else ("switch to baseline" if on_fail == "baseline" else "fail the deploy")
    )
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
) -> dict:
    """What a gate decision depends on, to record with it (gate["fingerprint"]): both units (the
    vLLM version, argv and speculative config are in them), the workload (request set, rate,
    concurrency, sampling; digested) and the gate's own settings."""
    blob = json.dumps(workload, sort_keys=True, default=str).encode()
    return {
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
        age = (now - datetime.fromisoformat(decided)).total_seconds() / 86400
        if age >= recheck_days:
            return {
                "recheck": True,
                "why": f"the fall-back was decided {age:.1f} days ago (gate_recheck_days = "
                f"{recheck_days:g})",
            }
    return {
        "recheck": False,
        "why": "same units, workload and gate settings as the previous fall-back"
        + (f", decided {decided}" if decided else ""),
    }
