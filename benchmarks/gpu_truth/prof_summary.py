"""Summarize a vLLM torch-profiler trace per engine step: the same work on host and GPU, fast/slow.

A step runs from one engine-step annotation (vLLM 0.26 names it
`execute_context_C(T)_generation_G(T)`, one per step on the engine thread) to the next. Steps in the
fastest quarter of periods are "fast", those in the slowest quarter "slow". Per group: median
period, GPU busy time (summed kernel durations), kernel and runtime-call counts; then, per host
operation (cpu_op / cuda_runtime) and per GPU kernel seen often in both groups, its mean duration
per call in fast and in slow steps. If the host's calls grow while the kernels stay put, the same
work ran slower on the CPU.

Usage: python3 prof_summary.py TRACE.json[.gz] OUT.json
"""

from __future__ import annotations

import bisect
import gzip
import json
import statistics
import sys
from collections import defaultdict


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def summarize(events: list[dict]) -> dict:
    marks = sorted(
        e["ts"]
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") == "user_annotation"
        and str(e.get("name", "")).startswith(("execute_context", "gpu_model_runner: forward"))
    )
    if len(marks) < 8:
        return {"error": f"{len(marks)} step annotations"}
    periods = [(b - a) / 1000 for a, b in zip(marks, marks[1:], strict=False)]
    q = statistics.quantiles(periods, n=4)
    mode = ["fast" if p <= q[0] else "slow" if p >= q[2] else "" for p in periods]
    per_step = [defaultdict(float) for _ in periods]
    calls: dict[str, dict[tuple, list[float]]] = {
        "fast": defaultdict(list),
        "slow": defaultdict(list),
    }
    for e in events:
        cat = e.get("cat")
        if e.get("ph") != "X" or cat not in ("kernel", "cpu_op", "cuda_runtime"):
            continue
        i = bisect.bisect_right(marks, e["ts"]) - 1
        if i < 0 or i >= len(periods):
            continue
        d = e["dur"] / 1000
        if cat == "kernel":
            per_step[i]["gpu_busy_ms"] += d
            per_step[i]["kernels"] += 1
        elif cat == "cuda_runtime":
            per_step[i]["runtime_calls"] += 1
        if mode[i]:
            calls[mode[i]][(cat, e["name"][:60])].append(e["dur"])
    out: dict = {
        "steps": len(periods),
        "period_ms_p25_p50_p75": [round(x, 3) for x in (q[0], q[1], q[2])],
    }
    for m in ("fast", "slow"):
        idx = [i for i in range(len(periods)) if mode[i] == m]
        out[m] = {
            "n": len(idx),
            "period_ms": round(statistics.median(periods[i] for i in idx), 3),
            **{
                k: round(statistics.median(per_step[i][k] for i in idx), 3)
                for k in ("gpu_busy_ms", "kernels", "runtime_calls")
            },
        }
    rows = []
    for key in set(calls["fast"]) & set(calls["slow"]):
        f, s = calls["fast"][key], calls["slow"][key]
        if min(len(f), len(s)) >= 100:
            mf, ms = sum(f) / len(f), sum(s) / len(s)
            rows.append(
                {
                    "cat": key[0],
                    "name": key[1],
                    "calls_fast": len(f),
                    "calls_slow": len(s),
                    "mean_us_fast": round(mf, 2),
                    "mean_us_slow": round(ms, 2),
                    "slow_over_fast": round(ms / mf, 3),
                }
            )
    rows.sort(key=lambda r: -r["mean_us_fast"] * r["calls_fast"])
    out["per_call"] = rows[:25]
    for cat in ("kernel", "cpu_op", "cuda_runtime"):
        rs = [r for r in rows if r["cat"] == cat]
        w = sum(r["mean_us_fast"] * r["calls_fast"] for r in rs)
        if w:  # time-weighted mean of slow/fast per-call ratio
            out[f"{cat}_slow_over_fast"] = round(
                sum(r["slow_over_fast"] * r["mean_us_fast"] * r["calls_fast"] for r in rs) / w, 3
            )
    return out


if __name__ == "__main__":
    res = summarize(load(sys.argv[1]))
    with open(sys.argv[2], "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: v for k, v in res.items() if k != "per_call"}, indent=1))
