"""Decisions over measured samples: per-arm summaries, speculative/baseline ratios, the choice of
num_speculative_tokens and the speculation gate. Pure functions: no host, no I/O.

The statistical unit everywhere (compare, tune, the gate) is ONE benchmark run against a freshly
restarted server: each run contributes one value per metric (that run's median TTFT/TPOT/ITL/E2E
latency, its output throughput). Requests inside one run share one server start and are not
independent samples of the arm, so they are never pooled, and never decide (on the H200 the
speculative TPOT swings up to 1.7x between starts while requests of one start agree).

One decision rule (issue 22): the exact permutation test on ranks of the run-level values
(stats.rank_test) at alpha (stats.DEFAULT_ALPHA, host data `decision_alpha`), with its false-verdict
rate <= alpha: compare_values (fixed runs) and next_step (sequential: add runs until it can decide
or the budget is spent) here; choose.choose_k (with a baseline arm: "leave speculation off" is an
answer) and choose.fleet_ratio (median of per-host ratios); gate_rule.gate_decision and
gate_rule.gate_next_step (one-sided, against max_tpot_ratio), gate_rule.gate_needs_recheck. "no
significant difference" and "too few runs to decide at alpha" are verdicts. The effect is the ratio
of medians with the rank-test inversion interval (stats.ratio_interval). Run order: run_order /
round_order. Calibration: benchmarks/decision_rule.py and tests/unit/decide/test_decision_rule.py.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

from specdeploy.config.record import BenchResult, ServerCounters, bench_result
from specdeploy.decide.metrics import pooled_per_position_acceptance
from specdeploy.decide.stats import (
    DEFAULT_ALPHA,
    RATIO_INTERVAL_METHOD,
    SEQUENTIAL_RULE,
    mad,
    median,
    min_runs_per_arm,
    rank_test,
    ratio_interval,
    sequential_looks,
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

RANDOM_REQUESTS_WARNING = (
    "the workload's request set is random tokens: how often drafts are accepted on it says nothing "
    "about real traffic, so neither does the verdict; set workload.dataset to your own request set "
    "(custom JSONL)"
)
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


def run_values(runs: Sequence[BenchResult | Mapping], metric: str) -> list[float]:
    """One value per run for `metric` (see METRICS), from bench results; runs without it are
    skipped."""
    key = METRICS[metric][0]
    figures = [bench_result(r).figure(key) for r in runs]
    return [float(v) for v in figures if isinstance(v, (int, float))]


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


def compare_arms(
    spec_runs: Sequence[Mapping], base_runs: Sequence[Mapping], *, alpha: float = DEFAULT_ALPHA
) -> dict[str, dict]:
    """{metric: compare_values result} of the speculative arm over the baseline arm, run-level
    values, each metric tested at alpha (TPOT is the one the product decides on; the others are
    reported with their own p-values, no correction across metrics)."""
    return {
        metric: compare_values(
            run_values(spec_runs, metric),
            run_values(base_runs, metric),
            lower_is_better=lower,
            alpha=alpha,
        )
        for metric, (_, _, _, lower) in METRICS.items()
    }


def acceptance_summary(counters: Sequence[ServerCounters | Mapping]) -> dict:
    """Pooled acceptance over runs from server counter deltas ({drafts, draft_tokens,
    accepted_tokens} as metrics.acceptance returns them): rate = sum(accepted)/sum(draft tokens),
    mean acceptance length = 1 + sum(accepted)/sum(drafts); plus the per-run rates' median."""
    counters = [ServerCounters.model_validate(c) for c in counters]
    drafts = sum(c.drafts or 0 for c in counters)
    proposed = sum(c.draft_tokens or 0 for c in counters)
    accepted = sum(c.accepted_tokens or 0 for c in counters)
    rates = [c.acceptance_rate for c in counters if c.acceptance_rate is not None]
    lengths = [c.mean_acceptance_length for c in counters if c.mean_acceptance_length is not None]
    return {
        "runs": len(counters),
        "drafts": drafts,
        "draft_tokens": proposed,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / proposed if proposed else None,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        "per_run_acceptance_rate": summarize_values(rates),
        "per_run_mean_acceptance_length": summarize_values(lengths),
        "per_position": pooled_per_position_acceptance([c.model_dump() for c in counters]),
    }


def host_data_change(host: str, speculative_config: Mapping, k: int) -> str:
    """The host-data line to set (printed by deploys/tune.py; it never edits group_data itself)."""
    new = {**speculative_config, "num_speculative_tokens": k}
    return f"host_data/{host}: speculative_config = {dict(sorted(new.items()))!r}"


# --- the speculation gate -------------------------------------------------------------------------


def per_request_tpot_ms(result: BenchResult | Mapping) -> list[float]:
    """Per-request TPOT (ms) from a `--save-detailed` bench result, as vLLM's bench computes it:
    (latency - ttft) / (output_len - 1) for requests with more than one output token. Descriptive
    only (predict.py, reports): requests of one run share one server start, so the gate never
    decides on them."""
    result, out = bench_result(result), []
    for latency, ttft, n in zip(
        result.latencies or [],
        result.ttfts or [],
        result.output_lens or [],
        strict=False,
    ):
        if n and n > 1 and latency is not None and ttft is not None:
            out.append((latency - ttft) / (n - 1) * 1000.0)
    return out
