"""On-device runner for issue 15's second H200 x2 session: what makes the speculative path swing
(one TP=1 server, observed from outside), then repeated TP=2 payoff starts.

Swing (row lane "S": GPU 0, server and client on CPUs 0-15, samplers on 16-31): one k=1 L=2.0
server; nvidia-smi at 100 ms and the server's threads (/proc schedstat) at 10 Hz run throughout;
phases, each a separate client run with a wall-clock time per engine output:
  as_before   64 sequential requests (c=1), then 48 at c=8 (6 waves)
  pinned      the engine-core's busiest thread alone on CPU 15, every other thread of the server
              and the client on CPUs 0-14 (taskset on the running processes), again 64 + 48
  profile     up to 3 torch-profiler windows of 150 engine steps each, started while the last
              finished request was slow (or fast), summarized on the device by prof_summary.py
Nothing about the GPU is changed (no clock, power or mode setting).

Repeats (rows with `load`): a fresh server per row, samplers on, warm-up, c=1 then c=8 with
client.py; records shaped like device_run.py's, so analyze.payoff reads them.

Run by `python -m benchmarks.device run gpu_truth_swing DIR [-- --swing-cap S]` (plan.py's second).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request

import benchmarks.device.common as dc
from benchmarks.device.common import log
from benchmarks.gpu_truth import client
from benchmarks.gpu_truth import device_run as dr

HERE = os.path.dirname(os.path.abspath(__file__))
LANES = {"S": ("0", "0-15", "16-31"), "P2": ("0,1", "0-27", "28-31")}
PROF_DIR = "/tmp/gt_prof"
LOGS = dr.LOGS


def post(port: int, path: str, timeout: float = 300) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status


def start_server(row: dict, deadline: float) -> tuple[subprocess.Popen, dict]:
    gpus, cpus, _ = LANES[row["lane"]]
    env = os.environ | row["env"] | {"CUDA_VISIBLE_DEVICES": gpus}
    rec = {k: row.get(k) for k in ("id", "lane", "tp", "arm", "note", "speculative")}
    rec["serve"] = row["serve"]
    argv = ["taskset", "-c", cpus, sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]
    log_path = f"{LOGS}/{row['id']}.serve.log"
    proc, rec["vllm"], rec["ready_s"] = dc.start_server(
        [*argv, *row["serve"]], env, log_path, row["port"], deadline
    )
    log(f"{row['id']}: {rec['vllm']} after {rec['ready_s']} s")
    return proc, rec


def stop_server(row: dict, proc: subprocess.Popen, rec: dict) -> None:
    dc.kill_group(proc)
    text = open(f"{LOGS}/{row['id']}.serve.log", errors="replace").read()
    for key, pattern in dr.PATTERNS.items():
        found = re.findall(pattern, text)
        if found:
            rec[key] = found[-1].replace(",", "")
    if rec.get("vllm") != "started":
        rec["log_tail"] = text[-2500:]
    dc.wait_gpu_free(LANES[row["lane"]][0])


def samplers(row: dict, proc: subprocess.Popen, tag: str) -> list[subprocess.Popen]:
    side = LANES[row["lane"]][2]
    py = [sys.executable, os.path.join(HERE, "procsample.py")]
    return [
        subprocess.Popen(
            ["taskset", "-c", side, *py, "host", str(proc.pid), f"{LOGS}/{tag}.host.jsonl", "10"]
        ),
        subprocess.Popen(["taskset", "-c", side, *py, "gpu", f"{LOGS}/{tag}.gpu.csv"]),
    ]


def stop_samplers(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


def run_client(port: int, n: int, conc: int, cpus: str, out: str, seed: int = 0) -> dict:
    t0 = time.time()
    subprocess.run(
        [
            "taskset",
            "-c",
            cpus,
            sys.executable,
            os.path.join(HERE, "client.py"),
            str(port),
            str(n),
            str(conc),
            out,
            "--seed",
            str(seed),
        ],
        timeout=300,
        check=False,
    )
    res = json.load(open(out)) if os.path.exists(out) else {"failed": n}
    res["t_start"], res["t_end"] = t0, time.time()
    log(
        f"  c={conc} n={n}: median TPOT {res.get('median_tpot_ms')} ms; per request "
        + " ".join(f"{t:.2f}" for t in res.get("per_request_tpot_ms", []))
    )
    return res


def engine_threads(root: int) -> tuple[int | None, list[tuple[int, int, int]]]:
    """The EngineCore process and its threads as (tid, ns on CPU so far)."""
    for pid in [root, *dr.descendants(root)]:
        try:
            if open(f"/proc/{pid}/comm").read().startswith("VLLM::EngineCor"):
                tids = []
                for tid in os.listdir(f"/proc/{pid}/task"):
                    run_ns = int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
                    tids.append((int(tid), run_ns))
                return pid, sorted(tids, key=lambda x: -x[1])
        except OSError:
            continue
    return None, []


def pin(root: int, core: int, others: str) -> dict:
    """Every thread of the server tree to `others`, then the engine's busiest thread to `core`."""
    for pid in [root, *dr.descendants(root)]:
        subprocess.run(["taskset", "-a", "-p", "-c", others, str(pid)], capture_output=True)
    pid, tids = engine_threads(root)
    if not tids:
        return {"error": "no EngineCore process"}
    busiest = tids[0][0]
    r = subprocess.run(
        ["taskset", "-p", "-c", str(core), str(busiest)], capture_output=True, text=True
    )
    return {
        "engine_pid": pid,
        "pinned_tid": busiest,
        "main_thread": busiest == pid,
        "taskset": r.stdout.strip(),
        "threads_by_cpu_ns": tids[:6],
    }


def profile_windows(port: int, cut_ms: float, deadline: float) -> list[dict]:
    """Sequential requests in a thread; start a 150-step profiler window when the last finished
    request was slow (> cut) and when it was fast, at most 3 windows."""
    done: list[dict] = []
    stop = threading.Event()
    prompts = client.prompts(200, 256, 7)

    def loop() -> None:
        for p in prompts:
            if stop.is_set():
                return
            try:
                done.append(client.one_request(port, p, 128))
            except Exception as error:
                done.append({"error": repr(error)})

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    windows: list[dict] = []
    seen = set(glob.glob(f"{PROF_DIR}/**/*.json*", recursive=True))
    t_clear = t_wait = time.time()  # requests sent before t_clear overlap a trace write: ignored
    while len(windows) < 3 and time.time() < deadline - 30:
        time.sleep(0.2)
        last = [r for r in done if "tpot_ms" in r and r["t_send"] > t_clear][-1:]
        if not last:
            continue
        mode = "slow" if last[0]["tpot_ms"] > cut_ms else "fast"
        modes = {w["trigger"] for w in windows}
        if windows and mode in modes and len(modes) == 1 and time.time() < t_wait + 25:
            continue  # wait up to 25 s for the other mode
        t0 = time.time()
        post(port, "/start_profile")
        time.sleep(3)
        post(port, "/stop_profile")
        new = []
        for _ in range(120):
            files = set(glob.glob(f"{PROF_DIR}/**/*.json*", recursive=True)) - seen
            sizes = {f: os.path.getsize(f) for f in files}
            time.sleep(1)
            if files and all(os.path.getsize(f) == s for f, s in sizes.items()):
                new = sorted(files)
                break
        seen |= set(new)
        w = {
            "trigger": mode,
            "last_tpot_ms": last[0]["tpot_ms"],
            "t_start": t0,
            "write_s": round(time.time() - t0, 1),
            "files": new,
        }
        for i, f in enumerate(new):
            out = f"{LOGS}/prof_{len(windows)}_{i}.json"
            r = subprocess.run(
                [sys.executable, os.path.join(HERE, "prof_summary.py"), f, out],
                capture_output=True,
                text=True,
            )
            w.setdefault("summaries", []).append(out if r.returncode == 0 else r.stderr[-800:])
            log(r.stdout[-1500:])
        windows.append(w)
        t_clear = t_wait = time.time()
        log(f"  profile window {len(windows)} ({mode}): {w['write_s']} s, {len(new)} files")
    stop.set()
    th.join(timeout=60)
    windows.append({"requests_during": [r.get("tpot_ms") for r in done]})
    return windows


def swing(row: dict, cap: float, out: str) -> dict:
    deadline = time.time() + cap
    proc, rec = start_server(row, deadline - 150)
    _, cpus, _ = LANES[row["lane"]]
    port = row["port"]
    phases = rec["phases"] = {}
    if rec["vllm"] != "started":
        stop_server(row, proc, rec)
        return rec
    smp = samplers(row, proc, row["id"])
    try:
        dc.warm(port)
        phases["as_before_c1"] = run_client(port, 64, 1, cpus, f"{LOGS}/swing_a_c1.json", 1)
        phases["as_before_c8"] = run_client(port, 48, 8, cpus, f"{LOGS}/swing_a_c8.json", 2)
        rec["pin"] = pin(proc.pid, 15, "0-14")
        log(f"  pinned: {rec['pin']}")
        phases["pinned_c1"] = run_client(port, 64, 1, "0-14", f"{LOGS}/swing_p_c1.json", 3)
        phases["pinned_c8"] = run_client(port, 48, 8, "0-14", f"{LOGS}/swing_p_c8.json", 4)
        tp = sorted(phases["as_before_c1"].get("per_request_tpot_ms") or [4.5])
        cut = (tp[len(tp) // 10] + tp[(9 * len(tp)) // 10]) / 2
        rec["cut_ms"] = cut
        if time.time() < deadline - 40:
            rec["profile"] = profile_windows(port, cut, deadline - 15)
    except Exception as error:
        rec["error"] = repr(error)
        log(f"swing error: {error!r}")
    finally:
        stop_samplers(smp)
        stop_server(row, proc, rec)
    return rec


def repeat_row(row: dict, deadline: float) -> dict:
    proc, rec = start_server(row, deadline)
    _, cpus, _ = LANES[row["lane"]]
    if rec["vllm"] != "started":
        stop_server(row, proc, rec)
        return rec
    smp = samplers(row, proc, row["id"])
    rec["bench"] = {}
    try:
        t = time.time()
        dc.warm(row["port"])
        rec["warm_s"] = round(time.time() - t, 1)
        for conc, n in row["load"].items():
            res = run_client(row["port"], n, int(conc), cpus, f"{LOGS}/{row['id']}_c{conc}.json")
            rec["bench"][conc] = res
    except Exception as error:
        rec["bench_error"] = repr(error)
    finally:
        stop_samplers(smp)
        stop_server(row, proc, rec)
    return rec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--budget", type=float, required=True)
    ap.add_argument("--swing-cap", type=float, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    start = time.time()
    for d in (LOGS, PROF_DIR, args.out):
        os.makedirs(d, exist_ok=True)
    plan = json.load(open(args.plan))
    records: list[dict] = []

    def save() -> None:
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(records, f)

    for row in plan:
        left = start + args.budget - time.time()
        if row["lane"] == "S":
            if left < 200:
                records.append({"id": row["id"], "skipped": f"budget: {left:.0f} s left"})
                continue
            log(f"{row['id']}: swing experiment ({left:.0f} s left)")
            records.append(swing(row, min(args.swing_cap, left), args.out))
        else:
            cold = not any(r.get("arm") == row["arm"] and r.get("vllm") for r in records)
            need = 200 if cold else 110
            if left < need:
                records.append(
                    {"id": row["id"], "arm": row["arm"], "skipped": f"budget: {left:.0f} s left"}
                )
                log(f"{row['id']}: skipped ({left:.0f} s left)")
                continue
            log(f"{row['id']}: starting ({left:.0f} s left)")
            records.append(repeat_row(row, start + args.budget))
        save()
    save()
    with tarfile.open(os.path.join(args.out, "logs.tar.gz"), "w:gz") as tar:
        tar.add(LOGS, arcname="logs")
    log(f"done in {time.time() - start:.0f} s")
    for r in records:
        cells = "  ".join(f"c{c}: {v.get('median_tpot_ms')}" for c, v in r.get("bench", {}).items())
        print(f"{r['id']:<16} {r.get('vllm', r.get('skipped'))} ready={r.get('ready_s')} {cells}")


if __name__ == "__main__":
    main()
