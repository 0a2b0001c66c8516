"""On-device runner of the H200 load proof (issue 39): rounds of fresh servers, every arm started
anew each round, then one `vllm bench serve` per load level on each, one server at a time.

Runs under the device image's python3 with vLLM 0.26.0 unpacked on PYTHONPATH; every argv comes
from plan.json (render.py: the product's own rendered unit argv and bench argv). The four servers
of a round share the GPU (0.23 of its memory each) and start one after another: the next starts
once the previous has sized its KV cache ("Available KV cache memory"), so no start's memory
profile sees another's allocations. Benchmarks run in this process through vLLM's own
`vllm bench serve` entry (vllm.benchmarks.serve.main with the argv parsed by its parser), so the
CLI's start-up is paid once, not per run. Idle servers run no kernels while another is measured.

Usage: python3 device_run.py --plan plan.json --rounds N --budget S --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_common import http_ok, kill_group, log, wait_gpu_free, warm

LOGS = "/tmp/logs"
RESULTS = "/tmp/results"
KEPT = "/tmp/kept"  # every run's raw result, as round<r>/<label>.json
# the next server of a "plan" round starts once the one before has applied its recorded KV size
# (or, where vLLM did not apply it, finished profiling): its snapshot is taken by then
PLANNED = ("Applying persisted startup plan", "Available KV cache memory")
PLANS = "/var/lib/specdeploy/cache/.cache/vllm/startup_plan"  # HOME of the unit, vLLM's cache root
GRAPH_LINES = (
    "cudagraph_mode",
    "CUDAGraphMode",
    "PIECEWISE",
    "Model Runner V2",
    "V1 model runner",
    "startup plan",
    "Available KV cache memory",
)


def start(arm: str, spec: dict, rnd: int, py: str) -> tuple[subprocess.Popen, str]:
    env = os.environ | spec["env"]
    os.makedirs(env["HOME"], exist_ok=True)
    path = f"{LOGS}/r{rnd}.{arm}.serve.log"
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


def bench(bargs: list[str]) -> None:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    main(parser.parse_args(bargs[2:]))  # after "bench serve"


def start_all(plan: dict, order: list[str], rnd: int, deadline: float, py: str, mode: str):
    """Start the round's servers. "warmup": all at once (compiles every arm's graphs into the
    compile cache; nothing measured, its startup plans deleted after). "serial": each after the
    one before is healthy, so each memory profile sees only finished co-tenants; with
    VLLM_ENABLE_STARTUP_PLAN=1 each records its KV size and the free memory it saw. "plan": in
    the same order, each once the one before has applied its recorded KV size (PLANNED): the
    next one's free memory is then at least what the serial round recorded, when every earlier
    server was fully up, so vLLM applies its recorded KV size too and skips profiling
    (v1/worker/startup_plan.py)."""
    procs, states = {}, {}
    for arm in order:
        spec = plan[arm]
        t0 = time.time()
        proc, path = start(arm, spec, rnd, py)
        procs[arm] = (proc, path, t0)
        url = f"http://127.0.0.1:{spec['port']}/health"
        if mode == "serial":
            states[arm] = wait_for(proc, path, (), url, deadline)
        elif mode == "plan":
            states[arm] = wait_for(proc, path, PLANNED, url, deadline)
        log(f"r{rnd} {arm}: started ({states.get(arm, mode)}) after {time.time() - t0:.0f} s")
    return procs


def run_round(plan: dict, order: list[str], rnd: int, deadline: float, py: str, mode: str):
    rec: dict = {"round": rnd, "mode": mode, "order": order, "servers": {}, "runs": []}
    procs = {}
    try:
        if mode == "warmup":  # a warm-up that hangs must not eat the measured rounds
            deadline = min(deadline, time.time() + 420)
        procs = start_all(plan, order, rnd, deadline, py, mode)
        for arm in order:
            proc, path, t0 = procs[arm]
            url = f"http://127.0.0.1:{plan[arm]['port']}/health"
            # a warm-up server is done once compiled and profiled: graphs are captured anew on
            # every start, only the compile cache carries over
            sized = ("Available KV cache memory",) if mode == "warmup" else ()
            state = wait_for(proc, path, sized, url, deadline)
            rec["servers"][arm] = {"state": state, "seconds_to_healthy": round(time.time() - t0, 1)}
            if state != "ok" and mode != "warmup":
                raise RuntimeError(f"{arm}: {state}")
        if mode == "warmup":
            log(f"r{rnd}: warm-up round {rec['servers']}")
            return rec
        log(f"r{rnd}: all healthy {rec['servers']}")
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
    except RuntimeError as e:
        rec["error"] = str(e)
        log(f"r{rnd}: stopped: {e}")
    finally:
        for arm, (proc, path, _) in procs.items():
            rec["servers"].setdefault(arm, {})["graph_lines"] = graph_lines(path)
            kill_group(proc)
        wait_gpu_free(below_mib=2000, tries=60)
        if mode == "warmup":  # its profiles overlapped: never reuse their KV sizes
            shutil.rmtree(PLANS, ignore_errors=True)
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
        mode = "warmup" if rnd == 0 else "serial" if rnd == 1 else "plan"
        records.append(run_round(plan, arms, rnd, deadline, sys.executable, mode))
        save(args.out, records)
    log("done")


if __name__ == "__main__":
    main()
