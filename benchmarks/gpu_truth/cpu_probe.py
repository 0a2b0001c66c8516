"""Does a vCPU of the H200 machine run the same work at one speed? (device side, stdlib only)

One process per CPU given, pinned there (sched_setaffinity), repeats two fixed work units for
SECONDS: `compute` (an integer loop) and `memory` (a strided walk over 64 MiB), and records how long
each unit took, in wall-clock and in CPU time (a unit descheduled shows wall > CPU time). Nothing
else runs: if the unit time still jumps between two levels in streaks, the vCPU itself runs slower
at times, which is what the engine thread's host calls showed in slow steps.

Usage: python3 cpu_probe.py SECONDS OUT.json CPU [CPU ...]
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys
import time


def compute() -> int:
    s = 0
    for i in range(20000):
        s += i * i
    return s


def memory(buf: bytearray) -> int:
    s = 0
    for i in range(0, len(buf), 4096 + 64):
        s += buf[i]
    return s


def worker(cpu: int, seconds: float, q: mp.Queue) -> None:
    os.sched_setaffinity(0, {cpu})
    buf = bytearray(os.urandom(64 << 20))
    out = {"compute": [], "memory": []}
    end = time.time() + seconds
    while time.time() < end:
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        compute()
        c1, t1 = time.thread_time_ns(), time.perf_counter_ns()
        memory(buf)
        c2, t2 = time.thread_time_ns(), time.perf_counter_ns()
        now = round(time.time(), 4)  # [time, wall us, CPU-time us] per unit
        out["compute"].append((now, (t1 - t0) // 1000, (c1 - c0) // 1000))
        out["memory"].append((now, (t2 - t1) // 1000, (c2 - c1) // 1000))
    q.put((cpu, out))


def main() -> None:
    seconds, path, cpus = float(sys.argv[1]), sys.argv[2], [int(c) for c in sys.argv[3:]]
    q: mp.Queue = mp.Queue()
    procs = [mp.Process(target=worker, args=(c, seconds, q)) for c in cpus]
    for p in procs:
        p.start()
    res = dict(q.get() for _ in procs)
    for p in procs:
        p.join()
    with open(path, "w") as f:
        json.dump({str(c): v for c, v in res.items()}, f)
    for c, v in sorted(res.items()):
        for kind, xs in v.items():
            us = sorted(x[1] for x in xs)
            q10, q50, q90 = (us[len(us) * k // 10] for k in (1, 5, 9))
            print(
                f"cpu {c} {kind}: n={len(us)} p10/p50/p90 {q10}/{q50}/{q90} us, "
                f"p90/p10 {q90 / q10:.2f}, mean {statistics.fmean(us):.0f}"
            )


if __name__ == "__main__":
    main()
