"""What moves when the speculative path is slow: the swing experiment's data, lined up in time.

Input: the device directory of `swing_run.py` (summary.json, logs.tar.gz with the samplers' files,
profile/prof_N.json: `prof_summary.py` over the Nth profiler window's trace, cpu_probe.json.gz:
`cpu_probe.py`'s output from a later call on a fresh machine of the same kind).
Every engine output the client saw is a step (ms per token = time since the previous output / tokens
it carried). Steps are smoothed (median of 7 inside a request) and split at the midpoint between the
10th and 90th percentile into fast and slow. Then, per mode: the GPU's clocks, power, pstate and
clock-event reasons (nvidia-smi, 100 ms), and the engine thread's time on a CPU, time waiting for
one and CPU changes (/proc schedstat, 10 Hz); where the mode switches (between requests or
inside one); the same for the pinned phase; and the profiler windows' fast vs slow steps.

Usage: python -m benchmarks.gpu_truth.swing DEVICE_DIR   (prints a summary, returns it as JSON)
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import statistics
import sys
import tarfile
from collections import Counter

SMOOTH = 7


def med(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def logs(device_dir: str) -> dict[str, str]:
    out = {}
    with tarfile.open(os.path.join(device_dir, "logs.tar.gz")) as tar:
        for m in tar.getmembers():
            if m.isfile():
                out[os.path.basename(m.name)] = tar.extractfile(m).read().decode(errors="replace")
    return out


def steps(result: dict) -> list[dict]:
    """Every output after a request's first, in time order: t (s), ms/token, request, position."""
    out = []
    for i, r in enumerate(result.get("requests") or []):
        if not r or "steps" not in r:
            continue
        t = r["t_first"]
        raw = []
        for dt, tokens in r["steps"]:
            t += dt / 1000
            if tokens > 0:
                raw.append((t, dt / tokens))
        for j, (t, v) in enumerate(raw):
            lo, hi = max(0, j - SMOOTH // 2), min(len(raw), j + SMOOTH // 2 + 1)
            smooth = statistics.median(x[1] for x in raw[lo:hi])
            out.append({"t": t, "ms": v, "smooth": smooth, "req": i, "pos": j, "n": len(raw)})
    return sorted(out, key=lambda s: s["t"])


def classify(ss: list[dict], cut: float | None = None) -> float:
    vals = sorted(s["smooth"] for s in ss)
    if cut is None:
        cut = (vals[len(vals) // 10] + vals[(9 * len(vals)) // 10]) / 2
    for s in ss:
        s["slow"] = s["smooth"] > cut
    return cut


def switches(ss: list[dict]) -> dict:
    """Mode changes: at a request boundary (within 3 outputs of its start or end) or inside one."""
    at_boundary, inside, runs, t_run = 0, 0, [], ss[0]["t"] if ss else 0
    for a, b in zip(ss, ss[1:], strict=False):
        if a["slow"] == b["slow"]:
            continue
        runs.append((a["slow"], b["t"] - t_run))
        t_run = b["t"]
        if b["req"] != a["req"] or b["pos"] < 3 or b["pos"] > b["n"] - 4:
            at_boundary += 1
        else:
            inside += 1
    slow_runs = [d for s, d in runs if s]
    fast_runs = [d for s, d in runs if not s]
    return {
        "switches": at_boundary + inside,
        "at_request_boundary": at_boundary,
        "inside_request": inside,
        "slow_streak_s_median": med(slow_runs),
        "fast_streak_s_median": med(fast_runs),
    }


def mode_at(ss: list[dict], t: float) -> bool | None:
    """The mode of the output that follows t (the step in progress at t), if within 50 ms."""
    lo, hi = 0, len(ss)
    while lo < hi:
        mid = (lo + hi) // 2
        if ss[mid]["t"] < t:
            lo = mid + 1
        else:
            hi = mid
    if lo < len(ss) and ss[lo]["t"] - t < 0.05:
        return ss[lo]["slow"]
    return None


def gpu_by_mode(text: str, ss: list[dict], gpu: str = "0") -> dict:
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return {}
    head = [h.strip() for h in rows[0]]
    out: dict[str, dict[str, list]] = {"fast": {}, "slow": {}}
    for r in rows[1:]:
        rec = dict(zip(head, (x.strip() for x in r), strict=False))
        if rec.get("index") != gpu:
            continue
        m = mode_at(ss, float(rec["t"]))
        if m is None:
            continue
        for k, v in rec.items():
            if k not in ("t", "timestamp", "index"):
                out["slow" if m else "fast"].setdefault(k, []).append(v)
    summary = {}
    for mode, cols in out.items():
        s = {"samples": len(next(iter(cols.values()), []))}
        for k, vs in cols.items():
            try:
                nums = [float(v) for v in vs]
                s[k] = {"median": med(nums), "min": min(nums), "max": max(nums)}
            except ValueError:
                s[k] = dict(Counter(vs).most_common(4))
        summary[mode] = s
    return summary


def host_by_mode(text: str, ss: list[dict], engine_name: str = "VLLM::EngineCor") -> dict:
    samples = [json.loads(line) for line in text.splitlines() if line.strip()]
    per = {"fast": [], "slow": []}
    prev_cpu = None
    t0, t1 = (ss[0]["t"], ss[-1]["t"]) if ss else (0, 0)
    for smp in samples:
        t, dt = smp["t"], smp["dt"]
        if not t0 <= t - dt or t > t1:
            continue
        inside = [s for s in ss if t - dt < s["t"] <= t]
        if not inside:
            continue
        slow = sum(s["slow"] for s in inside) > len(inside) / 2
        eng = [v for v in smp["threads"].values() if v[0].startswith(engine_name)]
        top = max(eng, key=lambda v: v[1]) if eng else None
        others = sorted((v for v in smp["threads"].values() if v is not top), key=lambda v: -v[1])[
            :3
        ]
        cpus = smp["cpus"].values()
        entry = {
            "engine_run_frac": top[1] / 1e6 / dt if top else 0.0,
            "engine_wait_frac": top[2] / 1e6 / dt if top else 0.0,
            "engine_slices": top[3] if top else 0,
            "engine_cpu_changed": bool(top and prev_cpu is not None and top[4] != prev_cpu),
            "engine_cpu_us_per_output": top[1] / len(inside) if top else 0.0,
            "steal_jiffies": sum(c[2] for c in cpus),
            "busy_cpus": sum(1 for c in smp["cpus"].values() if c[0] > c[1]),
            "others": [f"{v[0]}:{v[1] // 1000}ms" for v in others],
        }
        prev_cpu = top[4] if top else prev_cpu
        per["slow" if slow else "fast"].append(entry)
    out = {}
    for mode, es in per.items():
        out[mode] = {
            "samples": len(es),
            "engine_run_frac": med([e["engine_run_frac"] for e in es]),
            "engine_runqueue_wait_frac": med([e["engine_wait_frac"] for e in es]),
            "engine_runqueue_wait_frac_max": round(
                max((e["engine_wait_frac"] for e in es), default=0), 3
            ),
            "engine_cpu_us_per_output": med([e["engine_cpu_us_per_output"] for e in es]),
            "engine_slices_per_sample": med([e["engine_slices"] for e in es]),
            "engine_cpu_changes_share": round(
                sum(e["engine_cpu_changed"] for e in es) / max(len(es), 1), 3
            ),
            "steal_jiffies_total": sum(e["steal_jiffies"] for e in es),
            "busy_cpus": med([e["busy_cpus"] for e in es]),
            "busiest_other_threads": Counter(
                o.split(":")[0] for e in es for o in e["others"]
            ).most_common(5),
        }
    return out


def phase_summary(result: dict, cut: float | None = None) -> tuple[list[dict], dict]:
    ss = steps(result)
    if not ss:
        return ss, {"error": "no steps"}
    cut = classify(ss, cut)
    tp = result.get("per_request_tpot_ms") or []
    slow = [s for s in ss if s["slow"]]
    fast = [s for s in ss if not s["slow"]]
    return ss, {
        "requests": len(tp),
        "median_tpot_ms": med(tp),
        "per_request_tpot_ms": [round(x, 2) for x in tp],
        "cut_ms_per_token": round(cut, 3),
        "slow_share_of_outputs": round(len(slow) / len(ss), 3),
        "fast_ms_per_token": med([s["ms"] for s in fast]),
        "slow_ms_per_token": med([s["ms"] for s in slow]),
        "tokens_per_output": round(
            sum(r["output_tokens"] - 1 for r in result["requests"] if r and "steps" in r)
            / max(len(ss), 1),
            3,
        ),
    } | switches(ss)


PROBE_CUT_US = {"compute": 1350, "memory": 950}  # between the two levels both units show


def cpu_probe(path: str) -> dict:
    """`cpu_probe.py`'s units per vCPU: the two speed levels, how often and how long the slow one
    lasts, whether the unit was descheduled (wall vs CPU time), and the slow share per second."""
    d = json.load(gzip.open(path, "rt"))
    t0 = min(v["compute"][0][0] for v in d.values())
    out = {}
    for cpu, v in sorted(d.items(), key=lambda kv: int(kv[0])):
        e = {}
        for kind, cut in PROBE_CUT_US.items():
            xs = v[kind]
            fast = [x[1] for x in xs if x[1] <= cut]
            slow = [x[1] for x in xs if x[1] > cut]
            e[kind] = {
                "units": len(xs),
                "fast_us": med(fast),
                "slow_us": med(slow),
                "slow_share": round(len(slow) / len(xs), 3),
                "wall_over_cpu_p99": round(
                    sorted(x[1] / max(x[2], 1) for x in xs)[int(0.99 * len(xs))], 4
                ),
            }
        flags = [x[1] > PROBE_CUT_US["compute"] for x in v["compute"]]
        runs, start = [], v["compute"][0][0]
        for x, a, b in zip(v["compute"][1:], flags, flags[1:], strict=False):
            if a != b:
                runs.append((a, x[0] - start))
                start = x[0]
        e["slow_streak_s_median"] = med([r for s, r in runs if s])
        e["slow_streak_s_max"] = round(max((r for s, r in runs if s), default=0), 3)
        per_s: dict[int, list[bool]] = {}
        for x, f in zip(v["compute"], flags, strict=False):
            per_s.setdefault(int(x[0] - t0), []).append(f)
        e["slow_share_per_second"] = [round(sum(f) / len(f), 2) for _, f in sorted(per_s.items())]
        out[cpu] = e
    return out


def analyze(device_dir: str) -> dict:
    summary = json.load(open(os.path.join(device_dir, "summary.json")))
    files = logs(device_dir)
    out: dict = {}
    for rec in summary:
        if rec.get("id") != "S_k1_tp1" or "phases" not in rec:
            continue
        out["pin"] = rec.get("pin")
        gpu_text = files.get(f"{rec['id']}.gpu.csv", "")
        host_text = files.get(f"{rec['id']}.host.jsonl", "")
        cut = None
        for name, result in rec["phases"].items():
            ss, s = phase_summary(result, cut if name.endswith("c1") else None)
            if name == "as_before_c1":
                cut = s.get("cut_ms_per_token")
            if ss and name.endswith("c1"):
                s["gpu"] = gpu_by_mode(gpu_text, ss)
                s["host"] = host_by_mode(host_text, ss)
            out[name] = s
        prof = []
        windows = [w for w in rec.get("profile") or [] if "trigger" in w]
        for i, w in enumerate(windows):
            path = os.path.join(device_dir, "profile", f"prof_{i}.json")
            if os.path.exists(path):  # prof_summary.py over the window's trace
                p = json.load(open(path))
                prof.append({"trigger": w["trigger"], "last_tpot_ms": w["last_tpot_ms"]} | p)
        for w in rec.get("profile") or []:
            if "requests_during" in w:
                out["profile_requests_tpot_ms"] = w["requests_during"]
        out["profile"] = prof
    probe = os.path.join(device_dir, "cpu_probe.json.gz")
    if os.path.exists(probe):
        out["cpu_probe"] = cpu_probe(probe)
    for rec in summary:  # the TP=2 repeats: per-request streaks and the GPU by mode
        if rec.get("arm") == "tp2_k1_L2.0" and rec.get("bench"):
            b = rec["bench"].get("1")
            if b and b.get("requests"):
                ss, s = phase_summary(b, out.get("as_before_c1", {}).get("cut_ms_per_token"))
                s.pop("cut_ms_per_token")
                s["gpu0"] = gpu_by_mode(files.get(f"{rec['id']}.gpu.csv", ""), ss, "0")
                out.setdefault("tp2_k1_c1", {})[rec["id"]] = s
    return out


def main() -> None:
    res = analyze(sys.argv[1])
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
