"""The tune flow's pure rules (measure/tune_flow.py drives the hosts): which k are pinned and
confirmed, reading what ran, the k beyond the window, the decision over the confirmed k, and the
summary a report shows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from specdeploy.config.record import BenchResult, bench_result
from specdeploy.decide.choose import choose_k, min_runs_for_choose_k
from specdeploy.decide.decisions import run_values
from specdeploy.decide.stats import DEFAULT_ALPHA, median, rank_test

PIN_MIDDLE_FROM = 5


def pin_ks(ks: Sequence[int]) -> list[int]:
    """The speculative k measured before predicting: smallest, largest, and the middle one of long
    lists (a third point measures the step model's own error)."""
    s = sorted(set(ks))
    pinned = {s[0], s[-1]}
    if len(s) >= PIN_MIDDLE_FROM:
        pinned.add(s[len(s) // 2])
    return sorted(pinned)


def neighbours(ks: Sequence[int], k: int) -> list[int]:
    """k and the k next to it in tune_k."""
    s = sorted(set(ks))
    i = s.index(k)
    return s[max(i - 1, 0) : i + 2]


def counted(results: Sequence[BenchResult | Mapping]) -> list[BenchResult]:
    return [r for r in map(bench_result, results) if not (r.run and r.run.warmup)]


def runs_by_label(results: Sequence[BenchResult | Mapping]) -> dict[str, list[BenchResult]]:
    out: dict[str, list[BenchResult]] = {}
    for r in counted(results):
        out.setdefault(r.run.arm, []).append(r)
    return out


def label_k(label: str) -> int:
    return 0 if label == "baseline" else int(label[1:])


def shown_faster(spec: Sequence[float], base: Sequence[float], alpha: float) -> bool:
    """The one-sided rank test says `spec`'s TPOTs are lower than `base`'s at `alpha`."""
    return bool(spec and base) and rank_test(spec, base, alternative="less")["p_value"] <= alpha


def predicted_off(rows: Sequence[Mapping], best: int) -> str | None:
    """Why only the predicted best k is confirmed: no k is predicted faster than the baseline's pin
    run (its neighbours are predicted slower still). None when the best k is predicted faster."""
    by_k = {r["k"]: r for r in rows}
    base, top = (by_k.get(0) or {}).get("tpot_ms"), by_k[best]["tpot_ms"]
    if base is None or top is None or top < base:
        return None
    return (
        f"no k is predicted faster than the baseline (best k = {best}: {top:.2f} ms; baseline "
        f"pin run {base:.2f} ms): only k = {best} is confirmed against the baseline, with the "
        "fewest runs at which choose_k can decide over one k"
    )


SHARED_SERVER_NOTE = (
    "share_server: the counted runs of one arm in one phase run back to back on one freshly "
    "started server (arms still alternate, each visit on a fresh server), each with its own "
    "request seed (seed + the arm's run number, the same for every arm); prefix caching is off "
    "in every measurement instance, and every run on a reused server must show zero prefix-cache "
    "hits on the server's own counters, else the tune stops. Runs of one visit share that "
    "server's start, so their spread does not include start-to-start variation."
)


def prefix_cache_evidence(results: Sequence[Mapping]) -> dict:
    """The evidence: prefix-cache queries and hits summed over runs on fresh / reused servers."""
    out = {}
    for r in map(bench_result, results):
        key = "fresh_server" if r.run is None or r.run.fresh_server else "reused_server"
        pc = r.run.prefix_cache if r.run else {}
        agg = out.setdefault(key, {"runs": 0, "queries": 0.0, "hits": 0.0})
        agg["runs"] += 1
        agg["queries"] += pc.get("queries") or 0.0
        agg["hits"] += pc.get("hits") or 0.0
    return out


def measured_tpot_by_k(results: Sequence[Mapping]) -> dict[int, list[float]]:
    return {label_k(label): run_values(rs, "tpot") for label, rs in runs_by_label(results).items()}


def next_k(window: Sequence[int], ks: Sequence[int], tpot_by_k: Mapping[int, Sequence[float]]):
    """The k beyond the window's edge when the measured best (lowest median TPOT) is at that edge
    and tune_k goes further; else None."""
    measured = [k for k in window if tpot_by_k.get(k)]
    if not measured:
        return None
    best = min(measured, key=lambda k: (median(tpot_by_k[k]), k))
    s = sorted(set(ks))
    if best == min(window) and s.index(best) > 0 and s[s.index(best) - 1] not in window:
        return s[s.index(best) - 1]
    if best == max(window) and s.index(best) < len(s) - 1 and s[s.index(best) + 1] not in window:
        return s[s.index(best) + 1]
    return None


def decide(results: Sequence[Mapping], confirm_k: Sequence[int], *, alpha: float) -> dict:
    """choose_k over the confirmed k's measured runs with the baseline's: the smallest k not slower
    than the best and faster than the baseline, or leave speculation off (choose.py)."""
    tpot = measured_tpot_by_k(results)
    return choose_k({k: tpot.get(k, []) for k in confirm_k}, baseline=tpot.get(0), alpha=alpha)


def flow_summary(results: Sequence[Mapping], record: Mapping, conditions: Mapping) -> dict:
    """Predicted (after the pin phase) vs measured TPOT for every measured k, the decision, and
    where the time went."""
    tpot = measured_tpot_by_k(results)
    predicted = {r["k"]: r for r in record["rows"]}
    rows = []
    for k in sorted(set(tpot) | set(predicted)):
        p, values = predicted.get(k, {}), tpot.get(k, [])
        measured_median = median(values) if values else None
        pinned = k == 0 or k in record["pinned_k"]
        rows.append(
            {
                "k": k,
                "role": "pinned" if pinned else ("confirmed" if values else "predicted only"),
                "acceptance_length": p.get("acceptance_length"),
                "predicted_tpot_ms": None if pinned else p.get("tpot_ms"),
                "predicted_low": None if pinned else p.get("tpot_ms_low"),
                "predicted_high": None if pinned else p.get("tpot_ms_high"),
                "measured_runs": len(values),
                "measured_tpot_ms": measured_median,
                "error": (p["tpot_ms"] / measured_median - 1)
                if values and not pinned and p.get("tpot_ms")
                else None,
            }
        )
    samples = [bench_result(r).run for r in results]
    seconds = [s.sample_seconds or 0.0 for s in samples]
    pin_n = record["pin_samples"] + sum(1 for s in samples if s.warmup)
    return {
        "decision": decide(
            results, record["confirm_k"], alpha=conditions.get("decision_alpha", DEFAULT_ALPHA)
        ),
        "record": dict(record),
        "rows": rows,
        "time": {
            "seconds": conditions.get("seconds"),
            "samples": len(samples),
            "server_starts": sum(1 for s in samples if s.seconds_to_healthy is not None),
            "pin_seconds": round(sum(seconds[:pin_n]), 1),
            "confirm_seconds": round(sum(seconds[pin_n:]), 1),
            # the sweep measures every k and the baseline, with the runs choose_k needs for them
            "sweep_samples_for_comparison": (len(record["tune_k"]) + 1)
            * min_runs_for_choose_k(
                len(record["tune_k"]), alpha=conditions.get("decision_alpha", DEFAULT_ALPHA)
            )
            + (conditions.get("warmup_runs") or 0),
        },
    }
