"""tune's choice of num_speculative_tokens under the one decision rule (decisions.py), and the
fleet-wide figure from paired per-host ratios. Pure functions: no host, no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from specdeploy.decide.decisions import TOO_FEW_RUNS, _clean, _fmt_ratio, summarize_values
from specdeploy.decide.stats import (
    DEFAULT_ALPHA,
    holm,
    mad,
    median,
    min_p_value,
    min_runs_per_arm,
    rank_test,
    sign_test,
)

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
    faster = holm(pvals, alpha)
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


def min_runs_for_choose_k(num_k: int, *, alpha: float = DEFAULT_ALPHA) -> int:
    """The fewest runs per arm (k arms and the baseline alike) at which choose_k can find any k
    faster than the baseline (one-sided level alpha/num_k): 4 for 1-3 k at alpha 0.05, 5 for
    4-15 k (the 7-k sweep)."""
    return min_runs_per_arm(alpha / num_k, alternative="less")


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
