"""Host and GPU samplers for one server run (device side; observe only, nothing is changed).

* `host`: every 1/HZ s, for each thread of the server's process tree, the deltas of
  /proc/PID/task/TID/schedstat (ns on a CPU, ns waiting on a run queue, time slices) and the CPU it
  last ran on; and per CPU of /proc/stat the busy and steal jiffies. One JSON line per sample.
* `gpu`: `nvidia-smi --query-gpu=FIELDS -lms 100` into a CSV, each line prefixed with time.time(),
  with the fields this driver accepts (each candidate is tried once first).

Usage: python3 procsample.py host ROOT_PID OUT.jsonl [HZ]     (runs until SIGTERM)
       python3 procsample.py gpu OUT.csv                       (execs nvidia-smi)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
GPU_FIELDS = [
    "index",
    "timestamp",
    "clocks.sm",
    "clocks.mem",
    "power.draw",
    "pstate",
    "clocks_event_reasons.active",
    "clocks_throttle_reasons.active",
    "utilization.gpu",
    "utilization.memory",
    "temperature.gpu",
]


def tree(root: int) -> list[int]:
    out, todo = [root], [root]
    while todo:
        p = todo.pop()
        try:
            kids = [int(k) for k in open(f"/proc/{p}/task/{p}/children").read().split()]
        except OSError:
            kids = []
        out += kids
        todo += kids
    return out


def read_threads(pids: list[int]) -> dict[str, tuple]:
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            base = f"/proc/{pid}/task/{tid}"
            try:
                stat = open(f"{base}/stat").read()
            except OSError:
                continue
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            cpu = int(fields[36])
            try:
                run_ns, wait_ns, slices = (int(x) for x in open(f"{base}/schedstat").read().split())
            except (OSError, ValueError):  # no schedstat: CPU ticks only, no run-queue wait
                run_ns, wait_ns, slices = (int(fields[11]) + int(fields[12])) * TICK_NS, 0, 0
            out[f"{pid}/{tid}"] = (name, run_ns, wait_ns, slices, cpu)
    return out


def read_cpus() -> dict[str, tuple[int, int, int]]:
    out = {}
    for line in open("/proc/stat"):
        if line.startswith("cpu") and line[3].isdigit():
            f = line.split()
            v = [int(x) for x in f[1:9]]  # user nice system idle iowait irq softirq steal
            out[f[0][3:]] = (v[0] + v[1] + v[2] + v[5] + v[6], v[3] + v[4], v[7])
    return out


def host(root: int, path: str, hz: float) -> None:
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    pids, pids_at = tree(root), time.time()
    prev_t, prev_c, prev_time = read_threads(pids), read_cpus(), time.time()
    with open(path, "w") as f:
        while not stop:
            time.sleep(1 / hz)
            now = time.time()
            if now - pids_at > 2:
                pids, pids_at = tree(root), now
            cur_t, cur_c = read_threads(pids), read_cpus()
            threads = {}
            for key, (name, run, wait, sl, cpu) in cur_t.items():
                p = prev_t.get(key)
                if p and (run - p[1] > 200_000 or wait - p[2] > 200_000):
                    threads[key] = [
                        name,
                        (run - p[1]) // 1000,
                        (wait - p[2]) // 1000,
                        sl - p[3],
                        cpu,
                    ]
            cpus = {}
            for c, (busy, idle, steal) in cur_c.items():
                p = prev_c.get(c)
                if p:
                    cpus[c] = [busy - p[0], idle - p[1], steal - p[2]]
            f.write(
                json.dumps(
                    {
                        "t": round(now, 4),
                        "dt": round(now - prev_time, 4),
                        "threads": threads,
                        "cpus": cpus,
                    }
                )
                + "\n"
            )
            prev_t, prev_c, prev_time = cur_t, cur_c, now


def gpu_fields() -> list[str]:
    ok = []
    for field in GPU_FIELDS:
        r = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        )
        if r.returncode == 0 and "Field" not in r.stdout and "not a valid" not in r.stdout:
            ok.append(field)
    return ok


def gpu(path: str) -> None:
    """nvidia-smi's lines, each prefixed with this machine's wall-clock time (time.time())."""
    fields = gpu_fields()
    proc = subprocess.Popen(
        [
            "nvidia-smi",
            f"--query-gpu={','.join(fields)}",
            "--format=csv,noheader,nounits",
            "-lms",
            "100",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    with open(path, "w") as f:
        f.write("t," + ",".join(fields) + "\n")
        for line in proc.stdout:
            f.write(f"{time.time():.3f},{line.strip()}\n")
            f.flush()
    proc.wait()


if __name__ == "__main__":
    if sys.argv[1] == "host":
        host(int(sys.argv[2]), sys.argv[3], float(sys.argv[4]) if len(sys.argv) > 4 else 10.0)
    else:
        gpu(sys.argv[2])
