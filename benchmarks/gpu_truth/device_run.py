"""On-device runner for benchmarks/gpu_truth (H200 x2): read the facts specdeploy reads, start each
planned server, record vLLM's verdict and memory lines, benchmark the payoff rows, stop.

Per row: the `Accelerators` fact's exact command output (after any memory hog is in place), then
`vllm serve` under taskset on the lane's GPU(s), until /health answers ("started") or the process
exits ("refused"). Payoff rows are benchmarked on that fresh server (warm-up requests, then c=1 and
c=8) while the engine's threads (CPU time, the CPUs they ran on, context switches) and the GPU's
busy percentage are sampled (NVML read 0 % throughout on the H200 x2 VM: not usable there). The
`ModelSnapshot` fact script runs once per model over the generated checkpoints. Everything lands in
OUT/summary.json after every row.

Run by `python -m benchmarks.device run gpu_truth DIR [-- --phase1 S]` (plan: plan.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import time

from benchmarks.device.common import kill_group, log, start_server, wait_gpu_free, warm

LOGS = "/tmp/gt_logs"
RESULTS = "/tmp/gt_results"
HF_HOME = "/tmp/hf"
LANES = {"A": ("0", "0-15"), "B": ("1", "16-31"), "P2": ("0,1", "0-31")}
COLD_S, WARM_S, EAGER_S = 200, 110, 60  # what a row needs before it is started
PATTERNS = {
    "vllm_kv_tokens": r"GPU KV cache size: ([\d,]+) tokens",
    "available_kv_gib": r"Available KV cache memory: ([\d.]+) GiB",
    "weights_gib": r"Model loading took ([\d.]+) GiB",
    "graphs_gib": r"Graph capturing finished in \d+ secs, took ([\d.]+) GiB",
    "max_concurrency": r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x",
}
ERRORS = (
    "Error",
    "error",
    "refuse",
    "Free memory on device",
    "No available memory",
    "To serve at least one request",
    "out of memory",
    "World size",
)
lock = threading.Lock()
records: list[dict] = []


def accelerator_fact(command: str, gpus: str) -> list[str]:
    env = os.environ | {"CUDA_VISIBLE_DEVICES": gpus}
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env).stdout
    return out.splitlines()


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = open(f"/proc/{p}/task/{p}/children").read().split()
        except OSError:
            kids = []
        for k in kids:
            out.append(int(k))
            todo.append(int(k))
    return out


def proc_name(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:80]
    except OSError:
        return "?"


def thread_stats(pid: int) -> dict:
    """tid -> (name, utime+stime ticks, last CPU), plus context switches of the process."""
    threads = {}
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                stat = open(f"/proc/{pid}/task/{tid}/stat").read()
                name = stat[stat.index("(") + 1 : stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2 :].split()
                threads[tid] = (name, int(fields[11]) + int(fields[12]), int(fields[36]))
            except (OSError, ValueError, IndexError):
                pass
        status = open(f"/proc/{pid}/status").read()
        vol = int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M).group(1))
        invol = int(re.search(r"^nonvoluntary_ctxt_switches:\s+(\d+)", status, re.M).group(1))
        allowed = re.search(r"^Cpus_allowed_list:\s+(\S+)", status, re.M).group(1)
    except (OSError, AttributeError):
        return {}
    return {"threads": threads, "vol": vol, "invol": invol, "allowed": allowed}


class Sampler(threading.Thread):
    """During one benchmark: GPU busy % (NVML) and, every 0.5 s, which CPUs the engine's busiest
    threads sit on."""

    def __init__(self, gpu_indices: list[int], pids: list[int]):
        super().__init__(daemon=True)
        self.gpu_indices, self.pids = gpu_indices, pids
        self.stop_flag = threading.Event()
        self.gpu_util: list[int] = []
        self.cpus_seen: dict[str, list[int]] = {}

    def run(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in self.gpu_indices]
        except Exception:
            handles = []
        while not self.stop_flag.wait(0.1):
            for h in handles:
                try:
                    self.gpu_util.append(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
                except Exception:
                    pass
            if len(self.gpu_util) % 5 == 0:
                for pid in self.pids:
                    for _tid, (name, _, cpu) in thread_stats(pid).get("threads", {}).items():
                        self.cpus_seen.setdefault(f"{pid}:{name}", []).append(cpu)


def cpu_delta(before: dict, after: dict, wall: float) -> dict:
    """Per process: busiest threads' CPU share over the window, CPUs used, context switches."""
    out = {}
    for pid, b in before.items():
        a = after.get(pid)
        if not a or not b:
            continue
        busy = []
        for tid, (name, ticks, _cpu) in a["threads"].items():
            prev = b["threads"].get(tid)
            if prev:
                share = (ticks - prev[1]) / os.sysconf("SC_CLK_TCK") / wall
                if share > 0.02:
                    busy.append({"tid": tid, "name": name, "cpu_share": round(share, 3)})
        busy.sort(key=lambda x: -x["cpu_share"])
        out[pid] = {
            "cmd": proc_name(int(pid)),
            "allowed": a["allowed"],
            "busy_threads": busy[:6],
            "vol_ctxt": a["vol"] - b["vol"],
            "invol_ctxt": a["invol"] - b["invol"],
        }
    return out


def summarize(path: str) -> dict:
    r = json.load(open(path))
    tpot = []
    for itls, n in zip(r.get("itls", []), r.get("output_lens", []), strict=False):
        if n and n > 1 and itls:
            tpot.append(round(1000.0 * sum(itls) / (n - 1), 4))
    keys = (
        "completed",
        "failed",
        "duration",
        "output_throughput",
        "median_ttft_ms",
        "median_tpot_ms",
        "mean_tpot_ms",
        "median_itl_ms",
        "median_e2el_ms",
        "spec_decode_acceptance_length",
        "spec_decode_acceptance_rate",
    )
    return {k: r.get(k) for k in keys} | {"per_request_tpot_ms": tpot}


def bench(row: dict, proc: subprocess.Popen, env: dict, taskset: list[str], rec: dict) -> None:
    port = row["port"]
    t = time.time()
    warm(port)
    rec["warm_s"] = round(time.time() - t, 1)
    pids = [proc.pid] + descendants(proc.pid)
    gpu_indices = [int(g) for g in LANES[row["lane"]][0].split(",")]
    rec["processes"] = {str(p): proc_name(p) for p in pids}
    rec["bench"] = {}
    for conc, bargs in row["bench"].items():
        sampler = Sampler(gpu_indices, pids)
        before = {str(p): thread_stats(p) for p in pids}
        t0 = time.time()
        sampler.start()
        blog = f"{LOGS}/{row['id']}.bench{conc}.log"
        with open(blog, "w") as lf:
            rc = subprocess.run(
                [*taskset, sys.executable, "-m", "vllm.entrypoints.cli.main", *bargs],
                env=env,
                stdout=lf,
                stderr=subprocess.STDOUT,
                timeout=240,
            ).returncode
        sampler.stop_flag.set()
        sampler.join()
        wall = time.time() - t0
        after = {str(p): thread_stats(p) for p in pids}
        result = os.path.join(RESULTS, bargs[bargs.index("--result-filename") + 1])
        entry = {"rc": rc, "wall_s": round(wall, 1)}
        if rc == 0 and os.path.exists(result):
            entry |= summarize(result)
        else:
            entry["tail"] = open(blog, errors="replace").read()[-1500:]
        util = sampler.gpu_util
        entry["gpu_busy_pct_median"] = sorted(util)[len(util) // 2] if util else None
        entry["gpu_busy_pct_samples"] = len(util)
        entry["cpu"] = cpu_delta(before, after, wall)
        busy = {f"{pid}:{t['name']}" for pid, c in entry["cpu"].items() for t in c["busy_threads"]}
        entry["cpus_seen"] = {k: sorted(set(v)) for k, v in sampler.cpus_seen.items() if k in busy}
        rec["bench"][conc] = entry
        log(
            f"{row['id']} c={conc}: TPOT {entry.get('median_tpot_ms')} ms, "
            f"GPU busy {entry['gpu_busy_pct_median']}%"
        )


def hog(gib: int, gpu: str) -> subprocess.Popen:
    code = (
        f"import torch,time,sys; x=torch.empty({gib}<<30,dtype=torch.uint8,device='cuda'); "
        "x.fill_(1); torch.cuda.synchronize(); print('held',flush=True); time.sleep(3600)"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        env=os.environ | {"CUDA_VISIBLE_DEVICES": gpu},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    p.stdout.readline()
    return p


def run_row(row: dict, command: str, deadline: float) -> dict:
    gpus, cpus = LANES[row["lane"]]
    taskset = ["taskset", "-c", cpus]
    rec = {
        k: row[k]
        for k in (
            "id",
            "lane",
            "tp",
            "hog_gib",
            "arm",
            "note",
            "speculative",
            "target_repo",
            "draft_repo",
        )
    }
    rec["data"] = row["data"]
    rec["serve"] = row["serve"]
    held = hog(row["hog_gib"], gpus.split(",")[0]) if row["hog_gib"] else None
    try:
        rec["accelerator_fact_output"] = accelerator_fact(command, gpus)
        env = os.environ | row["env"] | {"CUDA_VISIBLE_DEVICES": gpus}
        if not row["arm"]:
            env["VLLM_LOGGING_LEVEL"] = "DEBUG"  # the memory profile breakdown
        serve_log = f"{LOGS}/{row['id']}.serve.log"
        argv = [*taskset, sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *row["serve"]]
        proc, rec["vllm"], rec["ready_s"] = start_server(
            argv, env, serve_log, row["port"], deadline
        )
        try:
            if rec["vllm"] == "refused":
                rec["exit_code"] = proc.returncode
            log(f"{row['id']}: {rec['vllm']} after {rec['ready_s']} s")
            if rec["vllm"] == "started" and row.get("bench"):
                try:
                    bench(row, proc, env, taskset, rec)
                except Exception as error:  # keep the row's memory verdict
                    rec["bench_error"] = repr(error)
        finally:
            kill_group(proc)
        text = open(serve_log, errors="replace").read()
        for key, pattern in PATTERNS.items():
            found = re.findall(pattern, text)
            if found:
                rec[key] = found[-1].replace(",", "")
        rec["profile_lines"] = [
            ln[-400:]
            for ln in text.splitlines()
            if "MemoryProfilingResult" in ln
            or "memory snapshot" in ln
            or "requested memory" in ln
            or "Initial free memory" in ln
        ][:8]
        if rec["vllm"] == "refused" and "Cannot load libtorch" in text:
            rec["vllm"] = "infra_error"  # seen when a device call lands while a process starts
        if rec["vllm"] != "started":
            rec["error_lines"] = [
                ln[-400:] for ln in text.splitlines() if any(e in ln for e in ERRORS)
            ][-12:]
            rec["log_tail"] = text[-2500:]
    finally:
        if held:
            kill_group(held)
        wait_gpu_free(gpus)
    return rec


def lane_worker(rows: list[dict], command: str, deadline: float, out: str) -> None:
    compiled: set[str] = set()
    for row in rows:
        eager = "--enforce-eager" in row["data"]["vllm_extra_args"]
        key = f"{row['tp']}:{row['speculative']}"
        need = EAGER_S if eager else (WARM_S if key in compiled else COLD_S)
        left = deadline - time.time()
        if left < need:
            rec = {"id": row["id"], "lane": row["lane"], "skipped": f"budget: {left:.0f} s left"}
            log(f"{row['id']}: skipped ({left:.0f} s left)")
        else:
            log(f"{row['id']}: starting ({left:.0f} s left)")
            rec = run_row(row, command, deadline)
            if not eager:
                compiled.add(key)
        with lock:
            records.append(rec)
            save(out)


def save(out: str) -> None:
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(records, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--budget", type=float, required=True)
    ap.add_argument("--phase1", type=float, required=True, help="seconds for the two lanes")
    ap.add_argument("--command", required=True, help="file with the Accelerators fact command")
    ap.add_argument("--model-facts", required=True, help="specdeploy/host/scripts/model_facts.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", help="only these rows (ids, comma-separated)")
    args = ap.parse_args()
    start = time.time()
    for d in (LOGS, RESULTS, args.out):
        os.makedirs(d, exist_ok=True)
    plan = json.load(open(args.plan))
    if args.rows:
        plan = [r for r in plan if r["id"] in args.rows.split(",")]
    command = open(args.command).read()
    source = open(args.model_facts).read()
    facts = {}
    for repo in sorted({r["target_repo"] for r in plan} | {r["draft_repo"] for r in plan} - {None}):
        out = subprocess.run(
            [sys.executable, "-c", source, HF_HOME, repo, "main"], capture_output=True, text=True
        ).stdout
        facts[repo] = json.loads(out)
    with open(os.path.join(args.out, "model_facts.json"), "w") as f:
        json.dump(facts, f, indent=1)
    log("model facts: " + ", ".join(f"{r}: {v['weight_bytes']}" for r, v in facts.items()))
    phase1_end = start + args.phase1
    lanes = [
        threading.Thread(
            target=lane_worker,
            args=([r for r in plan if r["lane"] == lane], command, phase1_end, args.out),
        )
        for lane in ("A", "B")
    ]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
    lane_worker([r for r in plan if r["lane"] == "P2"], command, start + args.budget, args.out)
    save(args.out)
    with tarfile.open(os.path.join(args.out, "logs.tar.gz"), "w:gz") as tar:
        tar.add(LOGS, arcname="logs")
    log(f"done in {time.time() - start:.0f} s")
    for r in records:
        b = r.get("bench", {})
        cells = "  ".join(f"c{c}: {v.get('median_tpot_ms')}" for c, v in b.items())
        print(
            f"{r['id']:<22} {r.get('vllm', r.get('skipped'))} kv={r.get('vllm_kv_tokens')} "
            f"avail={r.get('available_kv_gib')} ready={r.get('ready_s')} {cells}"
        )


if __name__ == "__main__":
    main()
