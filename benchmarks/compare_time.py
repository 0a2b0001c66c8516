"""How long does deploys/compare.py (3 repeats per arm) take on the sandbox fleet? \
Target: <= 10 min.

    SPECDEPLOY_STATE_DIR=/run/specdeploy/sandbox-mine specdeploy-sandbox up --hosts 2
    python benchmarks/compare_time.py [--repeats 3] [--warmup-runs 1] [--no-apc] \
[--limit HOST] [--deploy]

Runs the real pyinfra deploy against inventories/sandbox.py (the fleet must be up; --deploy runs
deploys/serve.py first), then prints the wall time and where it went \
(server starts, benchmarks), from
the run's raw files. Host load matters: \
the sandbox shares the control node's CPUs, so the load average
at start and end is printed with the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 600


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup-runs", type=int, default=1)
    p.add_argument("--no-apc", action="store_true", help="skip the prefix-caching profile")
    p.add_argument("--limit", help="only this host")
    p.add_argument("--deploy", action="store_true", help="run deploys/serve.py first (not timed)")
    args = p.parse_args()

    inventory = str(REPO / "inventories/sandbox.py")
    if args.deploy:
        r = subprocess.run(
            ["pyinfra", "-y", inventory, "deploys/serve.py"],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if r.returncode:
            print(r.stdout[-3000:], r.stderr[-3000:], file=sys.stderr)
            return r.returncode
    run = f"compare-time-{time.strftime('%Y%m%dT%H%M%S')}"
    env = {
        **os.environ,
        "SPECDEPLOY_RUN": run,
        "SPECDEPLOY_COMPARE_REPEATS": str(args.repeats),
        "SPECDEPLOY_COMPARE_WARMUP_RUNS": str(args.warmup_runs),
        "SPECDEPLOY_COMPARE_APC_PROFILE": "0" if args.no_apc else "1",
    }
    cmd = [
        "pyinfra",
        "-y",
        inventory,
        *(["--limit", args.limit] if args.limit else []),
        "deploys/compare.py",
    ]
    load_before = os.getloadavg()
    started = time.monotonic()
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    wall = time.monotonic() - started
    load_after = os.getloadavg()
    if r.returncode:
        print(r.stdout[-4000:], r.stderr[-4000:], file=sys.stderr)
        print(f"compare FAILED after {wall:.0f} s", file=sys.stderr)
        return r.returncode

    run_dir = REPO / "reports" / run
    print(
        f"deploys/compare.py, {args.repeats} repeats per arm, {args.warmup_runs} warm-up run(s), "
        f"APC profile {'off' if args.no_apc else 'on'}: {wall:.0f} s wall "
        f"({wall / 60:.1f} min; target <= "
        f"{TARGET_S // 60} min: {'met' if wall <= TARGET_S else 'NOT met'})"
    )
    print(
        f"load average at start {load_before[0]:.1f}, at end {load_after[0]:.1f} "
        f"(control node: {os.cpu_count()} CPUs)"
    )
    for host_dir in sorted((run_dir / "raw").glob("*")):
        cond = json.loads((host_dir / "conditions.json").read_text())
        samples = [
            json.loads(f.read_text())["specdeploy"]
            for f in sorted(host_dir.glob("[0-9][0-9]-*.json"))
        ]
        start = [
            s["seconds_to_healthy"] for s in samples if s.get("seconds_to_healthy") is not None
        ]
        bench = [s["bench_seconds"] for s in samples]
        print(
            f"  {host_dir.name}: {cond['seconds']:.0f} s for {len(samples)} samples + restore; "
            f"per sample: server start median {statistics.median(start):.0f} s, "
            f"benchmark median {statistics.median(bench):.0f} s"
        )
    print(f"report: {run_dir}/summary.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
