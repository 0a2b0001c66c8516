"""Printed, not asserted: what deploys/serve.py spends per host after the server has started
(health check + smoke benchmark), and a no-op re-run on 2 hosts.

    python benchmarks/serve_time.py [--hosts 2] [--keep]

Uses its own sandbox fleet (SPECDEPLOY_STATE_DIR, default /run/specdeploy/sandbox-serve-bench). The
per-host figures come from the deployment record each host wrote: health.seconds_to_healthy is the
server start (excluded), the checks after /health answered and the smoke benchmark \
are what is counted.
Targets from issue 4: health + smoke per host <= 60 s excluding server start; \
no-op re-run on 2 hosts
<= 5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEPLOY = ["pyinfra", "-y", "inventories/sandbox.py", "deploys/serve.py"]


def timed(command: list[str]) -> float:
    started = time.monotonic()
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(
            f"failed ({result.returncode}): {' '.join(command)}\n"
            f"{(result.stdout + result.stderr)[-4000:]}"
        )
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="leave the fleet up")
    args = parser.parse_args()
    os.environ.setdefault("SPECDEPLOY_STATE_DIR", "/run/specdeploy/sandbox-serve-bench")
    import specdeploy_sandbox as sandbox
    from specdeploy_sandbox import hosts as sandbox_hosts

    state = sandbox.up(args.hosts)
    first = timed(DEPLOY)
    print(
        f"first deploy on {args.hosts} host(s): {first:.1f}s "
        "(install, weights, start, checks, smoke)"
    )
    for h in state["hosts"]:
        out = subprocess.run(
            sandbox_hosts.ssh_command(
                state, h["address"], "cat /var/lib/specdeploy/records/specdeploy-vllm.json"
            ),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        timings = json.loads(out)["timings"]
        print(
            f"{h['name']}: server start {timings['server_start_seconds']:.1f}s (excluded); "
            "health checks + "
            f"smoke benchmark {timings['checks_and_smoke_seconds']:.1f}s (target <= 60 s)"
        )
    noop = timed(DEPLOY)
    print(f"no-op re-run on {args.hosts} host(s): {noop:.1f}s (target <= 5 s)")
    if not args.keep:
        sandbox.down()


if __name__ == "__main__":
    main()
