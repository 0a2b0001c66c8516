"""Decisions over measured samples: per-arm summaries, speculative/baseline ratios, the choice of
num_speculative_tokens and the speculation gate. Pure functions: no host, no I/O.

The statistical unit for comparisons (deploys/compare.py, deploys/tune.py) is ONE benchmark run
against a freshly restarted server: each run contributes one value per metric (that run's median
TTFT/TPOT/ITL/E2E latency, its output throughput). Requests inside one run share a warm server and
are not independent samples of the arm, so they are never pooled across runs here.

The speculation gate is the exception: it is a quick smoke A/B (one run per arm), so it compares the
per-request TPOTs of the two runs; that band shows request-to-request spread, not run-to-run noise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ..metrics import pooled_per_position_acceptance
from .stats import mad, median, ratio_with_band

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


def verdict(band: Mapping, *, lower_is_better: bool) -> str:
    """'better', 'worse' or 'within noise' for the speculative arm."""
    if band.get("ratio") is None:
        return "not comparable"
    low, high = band["low"], band["high"]
    if high is not None and high < 1.0:
        return "better" if lower_is_better else "worse"
    if low is not None and low > 1.0:
        return "worse" if lower_is_better else "better"
    return "within noise"


def compare_values(
    spec: Sequence[float], base: Sequence[float], *, lower_is_better: bool = True
) -> dict:
    """ratio = median(spec)/median(base) with stats.ratio_with_band's noise band, plus a verdict.
    A baseline median of 0 (e.g. ITL when the baseline streams coalesced chunks) is not
    comparable."""
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
            "verdict": "not comparable",
            "why": why,
        }
    band = ratio_with_band(spec, base)
    out = {
        "ratio": _clean(band["ratio"]),
        "low": _clean(band["low"]),
        "high": _clean(band["high"]),
        "significant": bool(band["significant"]),
    }
    if len(spec) < 2 or len(base) < 2:  # one run has no spread: no noise estimate, no verdict
        out.update(significant=False, verdict="too few runs", why="fewer than 2 runs in an arm")
        return out
    out["verdict"] = verdict(out, lower_is_better=lower_is_better)
    return out


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


def choose_k(tpot_by_k: Mapping[int, Sequence[float]]) -> dict:
    """Recommend the smallest k whose TPOT is within the noise band of the best k.

    best = the k with the lowest median TPOT. k is "within noise of the best" when the lower edge of
    its ratio band against the best (stats.ratio_with_band(k, best)) is <= 1, i.e.
    median(k) - mad(k) <= median(best) + mad(best): the two cannot be told apart by their
    run-to-run spread. Smaller k wins among those: fewer draft steps and less draft KV for the same
    speed."""
    ks = sorted(k for k, v in tpot_by_k.items() if v)
    if not ks:
        raise ValueError("no TPOT samples for any k")
    best = min(ks, key=lambda k: (median(tpot_by_k[k]), k))
    per_k = {}
    for k in ks:
        values = list(tpot_by_k[k])
        band = ratio_with_band(values, tpot_by_k[best])
        per_k[k] = {
            **summarize_values(values),
            "ratio_to_best": _clean(band["ratio"]),
            "low": _clean(band["low"]),
            "high": _clean(band["high"]),
            "within_noise_of_best": band["low"] <= 1.0,
        }
    recommended = min(k for k in ks if per_k[k]["within_noise_of_best"])
    return {
        "best_k": best,
        "recommended_k": recommended,
        "per_k": per_k,
        "rule": "smallest k with median(k) - MAD(k) <= median(best) + MAD(best) (TPOT, run-level)",
    }


def host_data_change(host: str, speculative_config: Mapping, k: int) -> str:
    """The host-data line to set (printed by deploys/tune.py; it never edits group_data itself)."""
    new = {**speculative_config, "num_speculative_tokens": k}
    return f"host_data/{host}: speculative_config = {dict(sorted(new.items()))!r}"


# --- the speculation gate -------------------------------------------------------------------------


def per_request_tpot_ms(result: Mapping) -> list[float]:
    """Per-request TPOT (ms) from a `--save-detailed` bench result, as vLLM's bench computes it:
    (latency - ttft) / (output_len - 1) for requests with more than one output token."""
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


def gate_decision(
    spec_tpot: Sequence[float], base_tpot: Sequence[float], *, max_tpot_ratio: float, on_fail: str
) -> dict:
    """Keep speculation only if median TPOT speculative/baseline <= max_tpot_ratio.

    The point ratio decides (a smoke A/B is small); the band is recorded, and `conclusive` says
    whether the whole band lies on the same side of the threshold as the ratio."""
    if not spec_tpot or not base_tpot:
        raise ValueError("the gate needs TPOT samples from both arms")
    band = ratio_with_band(spec_tpot, base_tpot)
    ratio, low, high = band["ratio"], band["low"], band["high"]
    passed = ratio <= max_tpot_ratio
    conclusive = (high <= max_tpot_ratio) if passed else (low > max_tpot_ratio)
    action = (
        "keep speculative"
        if passed
        else ("switch to baseline" if on_fail == "baseline" else "fail the deploy")
    )
    reason = (
        f"median TPOT speculative {median(spec_tpot):.3f} ms / baseline {median(base_tpot):.3f} ms "
        f"= {ratio:.3f} (noise band {low:.3f}-{_fmt(high)}); required <= {max_tpot_ratio}: "
        f"{'passed' if passed else 'failed'}"
        f"{'' if conclusive else ' (band straddles the threshold)'} -> {action}"
    )
    return {
        "passed": passed,
        "conclusive": conclusive,
        "action": action,
        "on_fail": on_fail,
        "max_tpot_ratio": max_tpot_ratio,
        "ratio": _clean(ratio),
        "low": _clean(low),
        "high": _clean(high),
        "speculative": summarize_values(list(spec_tpot)),
        "baseline": summarize_values(list(base_tpot)),
        "reason": reason,
    }


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3f}"
