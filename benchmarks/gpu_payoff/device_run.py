"""On-device runner: start each planned server once, warm it, run `vllm bench serve` at every
planned concurrency, stop it, and write a compact summary to $OUT after every arm.

Runs on the H200 machine under its python3 (vLLM unpacked in /tmp/site on PYTHONPATH); needs nothing
from specdeploy: every argv comes from plan.json, which plan.py builds with specdeploy's own code.

Run by `python -m benchmarks.device run gpu_payoff DIR [-- --arms a,b,c|@queue]` (plan: plan.py).
Arms run in the order given and are skipped once the budget would be overrun, so order by priority.
The device runner starts it in its own session so that it outlives one 10-minute device call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import time

from benchmarks.device.common import kill_group, log, start_server, wait_gpu_free, warm

LOGS = "/tmp/logs"
RESULTS = "/tmp/results"
MIN_ARM_S = 70  # a warm-cache arm: ~35 s to serve, ~35 s of benchmarks
COLD_ARM_S = 150  # first arm of a kind: torch.compile without cache
HIGHLIGHTS = (
    "torch.compile take",
    "Compiling a graph",
    "Graph capturing finished",
    "init engine",
    "Asynchronous scheduling is",
    "Model Runner V2",
    "V1 model runner",
    "cudagraph_mode",
    "Loading weights took",
    "Model loading took",
    "Available KV cache memory",
    "Using FLASH",
    "backend",
    "Traceback",
    "Error",
    "error",
)


def stop(proc: subprocess.Popen) -> None:
    kill_group(proc)  # the engine-core children share the process group
    wait_gpu_free(below_mib=2000, tries=40)


def summarize(path: str) -> dict:
    with open(path) as f:
        r = json.load(f)
    tpot, itl_med, chunks = [], [], []
    for itls, n in zip(r.get("itls", []), r.get("output_lens", []), strict=False):
        if n and n > 1 and itls:
            tpot.append(1000.0 * sum(itls) / (n - 1))
            itl_med.append(1000.0 * statistics.median(itls))
            chunks.append(len(itls) + 1)
    keys = (
        "completed",
        "failed",
        "duration",
        "output_throughput",
        "request_throughput",
        "median_ttft_ms",
        "median_tpot_ms",
        "mean_tpot_ms",
        "p99_tpot_ms",
        "median_itl_ms",
        "mean_itl_ms",
        "p99_itl_ms",
        "median_e2el_ms",
        "spec_decode_acceptance_length",
        "spec_decode_acceptance_rate",
        "spec_decode_num_drafts",
        "spec_decode_draft_tokens",
        "spec_decode_accepted_tokens",
        "max_concurrency",
        "total_output_tokens",
    )
    out = {k: r.get(k) for k in keys}
    out.update(
        per_request_tpot_ms=tpot,
        per_request_median_itl_ms=itl_med,
        per_request_chunks=chunks,
        output_lens=r.get("output_lens"),
    )
    return out


def highlights(path: str, limit: int = 40) -> list[str]:
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        return []
    hits = [ln[-300:] for ln in lines if any(h in ln for h in HIGHLIGHTS)]
    return hits[-limit:]


def run_arm(name: str, arm: dict, deadline: float, py: str) -> dict:
    rec: dict = {"arm": name, "meta": arm["meta"], "serve": arm["serve"], "env": arm["env"]}
    env = os.environ | arm["env"]
    serve_log = f"{LOGS}/{name}.serve.log"
    port = arm["port"]
    t0 = time.time()
    argv = [py, "-m", "vllm.entrypoints.cli.main", "serve", *arm["serve"]]
    proc, state, ready_s = start_server(argv, env, serve_log, port, deadline - 30)
    try:
        if state == "refused":
            rec["error"] = f"server exited with {proc.returncode} before it was ready"
            return rec
        if state == "timeout":
            rec["error"] = "server not ready before the budget ran out"
            return rec
        rec["ready_s"] = ready_s
        log(f"{name}: ready in {rec['ready_s']} s")
        t1 = time.time()
        warm(port, arm["served_name"])
        rec["warm_s"] = round(time.time() - t1, 1)
        rec["bench"] = {}
        for conc, bargs in arm["bench"].items():
            left = deadline - time.time()
            if left < 20:
                rec.setdefault("skipped", []).append(f"c{conc}: budget")
                continue
            blog = f"{LOGS}/{name}.bench{conc}.log"
            tb = time.time()
            with open(blog, "w") as lf:
                try:
                    rc = subprocess.run(
                        [py, "-m", "vllm.entrypoints.cli.main", *bargs],
                        env=env,
                        stdout=lf,
                        stderr=subprocess.STDOUT,
                        timeout=left - 10,
                    ).returncode
                except subprocess.TimeoutExpired:
                    rc = "timeout"
            result = os.path.join(RESULTS, bargs[bargs.index("--result-filename") + 1])
            if rc == 0 and os.path.exists(result):
                rec["bench"][conc] = summarize(result) | {"wall_s": round(time.time() - tb, 1)}
                b = rec["bench"][conc]
                log(
                    f"{name} c={conc}: TPOT {b['median_tpot_ms']:.2f} ms  "
                    f"ITL {b['median_itl_ms']:.2f} ms  "
                    f"AL {b.get('spec_decode_acceptance_length')}  "
                    f"({rec['bench'][conc]['wall_s']} s)"
                )
            else:
                rec["bench"][conc] = {
                    "error": f"bench rc={rc}",
                    "tail": open(blog, errors="replace").read()[-1500:],
                }
                log(f"{name} c={conc}: bench failed rc={rc}")
        return rec
    finally:
        rec["log_highlights"] = highlights(serve_log)
        if "error" in rec:
            rec["log_tail"] = open(serve_log, errors="replace").read()[-3000:]
            log(f"{name}: {rec['error']}")
        stop(proc)
        rec["total_s"] = round(time.time() - t0, 1)


def save(out: str, records: list[dict]) -> None:
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(records, f, indent=1)
    with tarfile.open(os.path.join(out, "logs.tar.gz"), "w:gz") as tar:
        tar.add(LOGS, arcname="logs")


def read_queue(spec: str) -> list[str]:
    """`a,b,c`, or `@FILE` with one arm a line (re-read before every arm, so a later device call can
    reorder or extend the queue while the runner is going)."""
    if spec.startswith("@"):
        with open(spec[1:]) as f:
            return [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]
    return [a for a in spec.split(",") if a]


def best_mode(records: list[dict]) -> str | None:
    """'async' or 'sync', from the k2_L2.5 pair at concurrency 1 (None until both have run)."""
    tpot = {}
    for r in records:
        b = r.get("bench", {}).get("1", {})
        if r["arm"] in ("k2_L2.5", "k2_L2.5_sync") and "median_tpot_ms" in b:
            tpot[r["arm"]] = b["median_tpot_ms"]
    if len(tpot) < 2:
        return None
    return "async" if tpot["k2_L2.5"] <= tpot["k2_L2.5_sync"] else "sync"


def resolve(entry: str, records: list[dict], async_broken: bool) -> str:
    """`NAME@best` / `NAME@other` pick the scheduling mode measured faster (or the other one)."""
    if "@" not in entry:
        return entry
    name, which = entry.split("@", 1)
    mode = "sync" if async_broken else (best_mode(records) or "async")
    if which == "other":
        mode = "sync" if mode == "async" else "async"
    return f"{name}_sync" if mode == "sync" else name


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--arms", required=True, help="a,b,c or @queue-file")
    ap.add_argument("--budget", type=float, required=True, help="seconds this script may run")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tag", default="run")
    ap.add_argument("--min-arm-s", type=float, default=MIN_ARM_S)
    ap.add_argument("--cold-arm-s", type=float, default=COLD_ARM_S)
    args = ap.parse_args()
    start = time.time()
    deadline = start + args.budget
    os.makedirs(LOGS, exist_ok=True)
    os.makedirs(RESULTS, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    plan = json.load(open(args.plan))
    py = sys.executable
    records: list[dict] = []
    done: set[str] = set()
    async_broken = False
    compiled_before = False
    while True:
        pending = [e for e in read_queue(args.arms) if e not in done]
        if not pending:
            break
        entry = pending[0]
        done.add(entry)
        name = resolve(entry, records, async_broken)
        if name not in plan or any(r["arm"] == name for r in records):
            log(f"{entry}: {name} unknown or already run, skipped")
            continue
        arm = plan[name]
        need = args.min_arm_s if compiled_before else args.cold_arm_s
        left = deadline - time.time()
        if left < need:
            records.append(
                {"arm": name, "meta": arm["meta"], "skipped": f"budget: {left:.0f} s left"}
            )
            log(f"{name}: skipped, {left:.0f} s left")
            continue
        log(f"{name}: starting ({left:.0f} s left)")
        rec = run_arm(name, arm, deadline, py)
        rec["tag"] = args.tag
        rec["started_at"] = round(time.time() - start - rec.get("total_s", 0), 1)
        records.append(rec)
        compiled_before = True
        if "error" in rec and "--async-scheduling" in arm["serve"] and "exited" in rec["error"]:
            async_broken = True
        save(args.out, records)
    save(args.out, records)
    log(f"done in {time.time() - start:.0f} s")
    for r in records:
        b = r.get("bench", {})
        cells = "  ".join(
            f"c{c}: TPOT {v.get('median_tpot_ms', float('nan')):.2f} "
            f"ITL {v.get('median_itl_ms', float('nan')):.2f}"
            for c, v in b.items()
            if isinstance(v, dict) and "median_tpot_ms" in v
        )
        print(
            f"{r['arm']:<22} ready {r.get('ready_s', '-')}s  {cells}  "
            f"{r.get('error', r.get('skipped', ''))}"
        )


if __name__ == "__main__":
    main()
