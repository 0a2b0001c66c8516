"""On-device runner of the H200 load proof (issue 39): rounds of fresh servers, every arm started
anew each round, then one `vllm bench serve` per load level on each, one server at a time.

Runs under the device image's python3 with vLLM 0.26.0 unpacked on PYTHONPATH; every argv comes
from plan.json (render.py: the product's own rendered unit argv and bench argv). The servers of a
round share the GPU (gpu_memory_utilization 0.23 each). vLLM sizes a server's KV cache from a
memory profile that counts every allocation on the device between its start-up snapshot and the
end of its profile run as its own (v1/worker/gpu_worker.py determine_available_memory), so no
other server may allocate inside that window: started all at once, the first recording's servers
computed -40, -8 and -6 GiB. The window is short (snapshot to "init engine ... took": 17-35 s);
the ~40 s before it are imports that use no device memory. So a measured round is pipelined: the
next server is launched once the one before has begun its engine ("Initializing a V1 LLM
engine") and `--stagger` seconds more, and only after every earlier server is ready; its own
imports then outlast the window before it. Every start is checked afterwards from its log (the
non-torch memory vLLM attributes to itself, and the windows' times); a start whose window saw
another's allocation, or that exited, is restarted alone once the others are up.

Benchmarks run in this process through vLLM's own `vllm bench serve` entry
(vllm.benchmarks.serve.main with the argv parsed by its parser), so the CLI's start-up is paid
once, not per run. Idle servers run no kernels while another is measured.

Run by `python -m benchmarks.device run gpu_load DIR -- --rounds N` (plan: render.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time

from benchmarks.device.common import http_ok, kill_group, log, wait_gpu_free, warm

LOGS = "/tmp/logs"
RESULTS = "/tmp/results"
KEPT = "/tmp/kept"  # every run's raw result, as round<r>/<label>.json
# vLLM 0.26.0's log lines (v1/engine/core.py, distributed/parallel_state.py, v1/worker/...)
ENGINE_START = "Initializing a V1 LLM engine"
SNAPSHOT = "world_size=1 rank=0"  # init_device: the memory snapshot is taken right after
SIZED = "Available KV cache memory"  # the profile's end
READY = "init engine (profile, create kv cache, warmup model) took"  # KV and graphs allocated
USAGE = re.compile(
    r"Actual usage is (?P<weights>-?[0-9.]+) GiB for weight, (?P<activation>-?[0-9.]+) GiB for "
    r"peak activation, (?P<non_torch>-?[0-9.]+) GiB for non-torch memory, and "
    r"(?P<graphs>-?[0-9.]+) GiB for CUDAGraph mem"
)
KV = re.compile(r"Available KV cache memory: (-?[0-9.]+) GiB")
STAMP = re.compile(r"INFO (\d\d-\d\d \d\d:\d\d:\d\d) ")
# a clean profile attributes ~0.2 GiB of non-torch memory to itself; another server's weights
# (16 GiB) or KV cache (15 GiB) inside the window would add that much
NON_TORCH_CLEAN_GIB = 2.0
GRAPH_LINES = (
    "cudagraph_mode",
    "CUDAGraphMode",
    "PIECEWISE",
    "Model Runner V2",
    "V1 model runner",
    "Available KV cache memory",
)


def start(arm: str, spec: dict, rnd: int, py: str, tag: str = "") -> tuple[subprocess.Popen, str]:
    env = os.environ | spec["env"]
    os.makedirs(env["HOME"], exist_ok=True)
    path = f"{LOGS}/r{rnd}.{arm}{tag}.serve.log"
    with open(path, "w") as lf:
        proc = subprocess.Popen(
            [py, "-m", "vllm.entrypoints.cli.main", "serve", *spec["serve"]],
            env=env,
            stdout=lf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, path


def wait_for(proc: subprocess.Popen, path: str, needles: tuple, url: str, deadline: float):
    """'ok' when the log holds one of `needles` or /health answers, 'exited', 'timeout'."""
    while time.time() < deadline:
        if proc.poll() is not None:
            return "exited"
        if needles and any(n in open(path, errors="replace").read() for n in needles):
            return "ok"
        if http_ok(url):
            return "ok"
        time.sleep(1)
    return "timeout"


def graph_lines(path: str) -> list[str]:
    lines = open(path, errors="replace").read().splitlines()
    return [ln[-400:] for ln in lines if any(g in ln for g in GRAPH_LINES)][:16]


def stamp(path: str, needle: str) -> str | None:
    """The time ("MM-DD HH:MM:SS") of the first log line holding `needle`."""
    for ln in open(path, errors="replace"):
        if needle in ln and (m := STAMP.search(ln)):
            return m[1]
    return None


def memory(path: str) -> dict:
    """What the start's memory profile found (vLLM's own figures, GiB) and when its window ran."""
    text = open(path, errors="replace").read()
    usage, kv = USAGE.search(text), KV.search(text)
    out = {k: float(v) for k, v in usage.groupdict().items()} if usage else {}
    out["kv_cache_gib"] = float(kv[1]) if kv else None
    out["window"] = [stamp(path, SNAPSHOT), stamp(path, READY)]
    return out


def clean(mem: dict) -> bool | None:
    """Whether the profile saw only its own allocations; None where vLLM logged no figures."""
    if "non_torch" not in mem:
        return None
    return abs(mem["non_torch"]) < NON_TORCH_CLEAN_GIB and (mem["kv_cache_gib"] or 0) > 0


def bench(bargs: list[str]) -> None:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    main(parser.parse_args(bargs[2:]))  # after "bench serve"


def url(spec: dict) -> str:
    return f"http://127.0.0.1:{spec['port']}/health"


def start_all(plan: dict, order: list[str], rnd: int, deadline: float, py: str, mode: str,
              stagger: float):  # fmt: skip
    """Start the round's servers. "warmup": all at once (compiles every arm's graphs into the
    compile cache; nothing measured: their memory profiles overlap). "pipelined": each next one
    once the one before has begun its engine, `stagger` s more, and every earlier one is ready
    (module docstring): its imports run while the one before profiles, its own window after."""
    procs = {}
    for i, arm in enumerate(order):
        if mode == "pipelined" and i:
            prev = order[i - 1]
            proc, path, _ = procs[prev]
            wait_for(proc, path, (ENGINE_START,), "", deadline)
            time.sleep(stagger)
            for earlier in order[: i - 1]:
                proc, path, _ = procs[earlier]
                wait_for(proc, path, (READY,), url(plan[earlier]), deadline)
        t0 = time.time()
        proc, path = start(arm, plan[arm], rnd, py)
        procs[arm] = (proc, path, t0)
        log(f"r{rnd} {arm}: launched")
    return procs


def restart_alone(plan: dict, arm: str, rnd: int, deadline: float, py: str, procs: dict) -> str:
    """Stop `arm`'s server and start it again while the others stand still: its memory profile
    then sees only their finished allocations."""
    proc, _, _ = procs[arm]
    kill_group(proc)
    time.sleep(3)  # its memory is released a little after its processes end
    t0 = time.time()
    proc, path = start(arm, plan[arm], rnd, py, tag=".restart")
    procs[arm] = (proc, path, t0)
    return wait_for(proc, path, (), url(plan[arm]), deadline)


def run_round(plan: dict, order: list[str], rnd: int, deadline: float, py: str, mode: str,
              stagger: float):  # fmt: skip
    rec: dict = {"round": rnd, "mode": mode, "order": order, "servers": {}, "runs": []}
    procs = {}
    t_round = time.time()
    try:
        if mode == "warmup":  # a warm-up that hangs must not eat the measured rounds
            deadline = min(deadline, time.time() + 420)
        procs = start_all(plan, order, rnd, deadline, py, mode, stagger)
        for arm in order:
            proc, path, t0 = procs[arm]
            # a warm-up server is done once compiled and profiled: graphs are captured anew on
            # every start, only the compile cache carries over
            sized = (SIZED,) if mode == "warmup" else ()
            state = wait_for(proc, path, sized, url(plan[arm]), deadline)
            rec["servers"][arm] = {"state": state, "seconds_to_healthy": round(time.time() - t0, 1)}
        if mode == "warmup":
            log(f"r{rnd}: warm-up round {rec['servers']}")
            return rec
        rec["seconds_to_all_started"] = round(time.time() - t_round, 1)
        for arm in order:
            server = rec["servers"][arm]
            server["memory"] = memory(procs[arm][1])
            server["clean_profile"] = clean(server["memory"])
            if server["state"] == "ok" and server["clean_profile"] is not False:
                continue
            log(f"r{rnd} {arm}: {server['state']}, profile {server['memory']}: restarting alone")
            server["first_start"] = {k: server.pop(k) for k in list(server)}
            server["first_start"]["graph_lines"] = graph_lines(procs[arm][1])
            t0 = time.time()
            state = restart_alone(plan, arm, rnd, deadline, py, procs)
            server |= {"state": state, "seconds_to_healthy": round(time.time() - t0, 1)}
            server["memory"] = memory(procs[arm][1])
            server["clean_profile"] = clean(server["memory"])
            if state != "ok":
                raise RuntimeError(f"{arm}: {state} after a restart alone")
        rec["seconds_to_all_healthy"] = round(time.time() - t_round, 1)
        log(f"r{rnd}: all healthy after {rec['seconds_to_all_healthy']} s {rec['servers']}")
        for arm in order:
            warm(plan[arm]["port"], plan[arm]["served_name"])
        os.makedirs(f"{KEPT}/round{rnd}", exist_ok=True)
        shift = rnd % len(order)  # no arm always measured first (as measure/load_flow.visits)
        rec["bench_order"] = order[shift:] + order[:shift]
        for arm in rec["bench_order"]:
            for _, bargs in sorted(plan[arm]["bench"].items(), key=lambda kv: int(kv[0])):
                if time.time() > deadline - 20:
                    raise RuntimeError("budget")
                name = bargs[bargs.index("--result-filename") + 1]
                t = time.time()
                try:
                    bench(bargs)
                except BaseException as e:  # a failed run is recorded, not fatal
                    rec["runs"].append({"file": name, "error": repr(e)[:500]})
                    continue
                shutil.move(f"{RESULTS}/{name}", f"{KEPT}/round{rnd}/{name}")
                r = json.load(open(f"{KEPT}/round{rnd}/{name}"))
                rec["runs"].append(
                    {"file": f"round{rnd}/{name}", "bench_s": round(time.time() - t, 1)}
                )
                log(
                    f"r{rnd} {name}: TPOT {r.get('median_tpot_ms'):.2f} ms "
                    f"AL {r.get('spec_decode_acceptance_length')} ({time.time() - t:.0f} s)"
                )
    except Exception as e:  # a broken round is recorded; the next one starts clean
        rec["error"] = repr(e)[:500]
        log(f"r{rnd}: stopped: {e!r}")
    finally:
        for arm, (proc, path, _) in procs.items():
            rec["servers"].setdefault(arm, {})["graph_lines"] = graph_lines(path)
            kill_group(proc)
        wait_gpu_free(below_mib=2000, tries=60)
        rec["seconds"] = round(time.time() - t_round, 1)
    return rec


def save(out: str, records: list[dict]) -> None:
    with open(os.path.join(out, "rounds.json"), "w") as f:
        json.dump(records, f, indent=1)
    with tarfile.open(os.path.join(out, "results.tar.gz"), "w:gz") as tar:
        tar.add(KEPT, arcname="results")
    with tarfile.open(os.path.join(out, "logs.tar.gz"), "w:gz") as tar:
        tar.add(LOGS, arcname="logs")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--rounds", type=int, required=True, help="measured rounds (after a warm-up)")
    ap.add_argument("--budget", type=float, required=True, help="seconds this script may run")
    ap.add_argument("--round-s", type=float, default=200, help="no round starts with less left")
    ap.add_argument("--stagger", type=float, default=10, help="s after the previous engine began")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    deadline = time.time() + args.budget
    for d in (LOGS, RESULTS, KEPT, args.out):
        os.makedirs(d, exist_ok=True)
    plan = json.load(open(args.plan))
    arms = list(plan)
    records: list[dict] = []
    for rnd in range(args.rounds + 1):
        if rnd and deadline - time.time() < args.round_s:
            log(f"r{rnd}: {deadline - time.time():.0f} s left, no more rounds")
            break
        mode = "warmup" if rnd == 0 else "pipelined"
        records.append(run_round(plan, arms, rnd, deadline, sys.executable, mode, args.stagger))
        save(args.out, records)
    log("done")


if __name__ == "__main__":
    main()
