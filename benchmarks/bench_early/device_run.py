"""On-device runner for benchmarks/bench_early (one H200, vLLM 0.26.0): specdeploy's own
`bench.PendingBench` (the product's code) against a CUDA vLLM server started from its rendered
argv, as `verify_and_record` and every measurement sample use it.

The device has no SSH and no systemd: the product's host commands (`on_host.sh`, which pyinfra runs
over SSH) run in a local shell here, as root, through the same function the product calls; the
device has no venv, so the launcher's python is the image's python3 with vLLM's tree on PYTHONPATH.

Cases (summary.json): `ahead` — the benchmark started before the server (its imports overlap the
server's start), run once the server is healthy and warm; `at_once` — started and run at once on
the healthy server (what a benchmark cost before); `cancelled` — started, then left unrun: its
process group ends and its directory goes; `stale` — one left waiting (a dead control node), ended
by the next start, which runs.

Run by `python -m benchmarks.device run bench_early` (plan: benchmarks.gpu_preflight.plan).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

from benchmarks.device.common import complete, kill_group, log, start_server
from specdeploy.config.schema import config_from_data
from specdeploy.host import bench, server
from specdeploy.host.on_host import HostCommandError

PYTHON = "python3"  # the image's; vLLM 0.26.0's tree is on PYTHONPATH


def local_sh(command: str, *, check: bool = True, stdin: str | None = None, timeout=None) -> str:
    done = subprocess.run(
        ["sh", "-c", command], input=stdin, capture_output=True, text=True, timeout=timeout
    )
    if check and done.returncode:
        raise HostCommandError(f"h200: `{command[:300]}` failed:\n{done.stderr[-4000:]}")
    return done.stdout


def running(directory: str) -> list[str]:
    """PIDs (not zombies) whose command line names `directory`."""
    found = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            if directory in (p / "cmdline").read_bytes().decode(errors="replace"):
                if (p / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(p.name)
        except OSError:
            pass
    return found


def pending(cfg, name: str) -> bench.PendingBench:
    p = bench.PendingBench(cfg, tokenizer=cfg.target_model, name=name)
    p.argv = [PYTHON, *p.argv[1:]]
    return p


def measured(result, started: float) -> dict:
    run = result.run
    return {
        "completed": result.completed,
        "failed": result.failed,
        "median_tpot_ms": result.median_tpot_ms,
        "bench_seconds": run.bench_seconds,
        "wall_seconds": round(time.monotonic() - started, 1),
        "acceptance_rate": run.server_counters.acceptance_rate if run.server_counters else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    plan = json.load(open(args.plan))
    os.makedirs(args.out, exist_ok=True)
    data = plan["configs"]["redeploy"] | {"state_dir": "/tmp/sd_state"}
    data["workload"] = {**data.get("workload", {}), "num_prompts": 16}
    cfg = config_from_data(data)
    Path(cfg.bench_dir).mkdir(parents=True, exist_ok=True)
    warnings: list[str] = []
    bench.sh = server.sh = local_sh
    bench.read_text = lambda path: Path(path).read_text()
    bench.host = types.SimpleNamespace(name="h200", print_prefix="[h200] ")
    bench.logger = types.SimpleNamespace(warning=lambda m: warnings.append(m) or log(m))
    summary: dict = {"vllm_cli_argv": None, "cases": {}, "warnings": warnings}
    out = Path(args.out)

    def save():
        (out / "summary.json").write_text(json.dumps(summary, indent=1))

    t0 = time.monotonic()
    ahead = pending(cfg, "ahead").start()
    summary["vllm_cli_argv"] = ahead.argv
    log(f"benchmark started ahead (pid {ahead.pid}); starting the server")
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *plan["serve"]]
    proc, state, secs = start_server(
        argv, os.environ | plan["env"], str(out / "serve.log"), plan["port"], time.time() + 420
    )
    try:
        log(f"server {state} after {secs} s")
        summary["server"] = {"state": state, "ready_s": secs}
        if state != "started":
            ahead.cancel()
            return
        complete(plan["port"], plan["served_model_name"], 16)  # the warm-up
        go = time.monotonic()
        summary["cases"]["ahead"] = measured(ahead.run(local=out / "ahead.json"), go) | {
            "since_start_s": round(time.monotonic() - t0, 1)
        }
        log(f"ahead: {summary['cases']['ahead']}")
        save()
        at = time.monotonic()
        with pending(cfg, "at_once") as once:
            summary["cases"]["at_once"] = measured(once.run(local=out / "at_once.json"), at)
        log(f"at once: {summary['cases']['at_once']}")
        save()
        gone = pending(cfg, "cancelled").start()
        time.sleep(3)
        before = running(gone.dir)
        gone.cancel()
        time.sleep(1)
        summary["cases"]["cancelled"] = {
            "running_before": len(before),
            "running_after": len(running(gone.dir)),
            "dir_left": Path(gone.dir).exists(),
        }
        log(f"cancelled: {summary['cases']['cancelled']}")
        stale = pending(cfg, "stale").start()
        time.sleep(3)
        with pending(cfg, "stale") as fresh:
            time.sleep(1)
            ended = not running(stale.dir) and not Path(stale.dir).exists()
            result = fresh.run(local=out / "fresh.json")
        summary["cases"]["stale"] = {
            "stale_ended": ended,
            "fresh_completed": result.completed,
            "warned": [w for w in warnings if "left waiting" in w],
        }
        log(f"stale: {summary['cases']['stale']}")
        summary["bench_dir_left"] = sorted(os.listdir(cfg.bench_dir))
    finally:
        kill_group(proc)
        save()
        log(f"done in {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
