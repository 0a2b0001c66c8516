"""Printed, not asserted: how long a first rollout takes on 1 vs 4 fresh sandbox hosts, and a no-op
re-run on 4 hosts.

    python benchmarks/rollout_time.py [--mode pyinfra|rollout] [--hosts 4]

Uses its own sandbox fleet (SPECDEPLOY_STATE_DIR, default /run/specdeploy/sandbox-bench) \
and tears it
down between sizes, so every "first" rollout starts from bare hosts \
(only the control node's caches --
wheelhouse, model mirror -- are warm). `--mode pyinfra` deploys all hosts at once
(`pyinfra -y inventories/sandbox.py deploys/serve.py`); `--mode rollout` runs
`specdeploy rollout ... --canary-group canary --batch-size N-1` (canary, then the rest together).
Targets from issue 6: 4 hosts within 2x of 1 host; no-op re-run on 4 hosts within 5 s.

    python benchmarks/rollout_time.py --noop-hosts 6

Issue 37's no-op scale figure instead: brings up N sandbox hosts once, deploys them once, then
times a no-op re-run on all N against the same re-run limited to one host, and counts the commands
each sends per host (pyinfra's --debug logs every SSH command: "Running command on ...").
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def timed(command: list[str]) -> float:
    started = time.monotonic()
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        sys.exit(
            f"failed ({result.returncode}): {' '.join(command)}\n"
            f"{(result.stdout + result.stderr)[-4000:]}"
        )
    return elapsed


def deploy_command(mode: str, hosts: int) -> list[str]:
    if mode == "rollout":
        return [
            "specdeploy",
            "rollout",
            "inventories/sandbox.py",
            "deploys/serve.py",
            "--canary-group",
            "canary",
            "--batch-size",
            str(max(1, hosts - 1)),
        ]
    return ["pyinfra", "-y", "inventories/sandbox.py", "deploys/serve.py"]


RAN_COMMAND = "Running command on "


def timed_noop(command: list[str]) -> tuple[float, int]:
    """A no-op re-run's seconds and the SSH commands it sent (from pyinfra's --debug log)."""
    started = time.monotonic()
    result = subprocess.run([*command, "--debug"], cwd=REPO, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(command)}\n{result.stderr[-4000:]}")
    return elapsed, (result.stdout + result.stderr).count(RAN_COMMAND)


def noop_scale(hosts: int, keep: bool) -> None:
    import specdeploy_sandbox as sandbox

    sandbox.down()
    names = [h["name"] for h in sandbox.up(hosts)["hosts"]]
    first = timed(deploy_command("pyinfra", hosts))
    print(f"first deploy on {hosts} fresh hosts: {first:.1f}s", flush=True)
    deploy = deploy_command("pyinfra", hosts)
    one_s, one_commands = timed_noop([*deploy, "--limit", names[0]])
    all_s, all_commands = timed_noop(deploy)
    if not keep:
        sandbox.down()
    print(f"\nno-op re-run ({os.cpu_count()} CPU cores; the sandbox hosts share them)")
    print(f"  1 host      {one_s:8.1f} s  {one_commands:5d} commands")
    print(f"  {hosts} hosts {all_s:8.1f} s  {all_commands / hosts:7.1f} commands per host")
    print(f"  {hosts} vs 1 host: {all_s / one_s:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=["pyinfra", "rollout"], default="pyinfra")
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--keep", action="store_true", help="leave the last fleet up")
    parser.add_argument("--noop-hosts", type=int, help="issue 37: no-op re-run on N hosts vs 1")
    args = parser.parse_args()
    os.environ.setdefault("SPECDEPLOY_STATE_DIR", "/run/specdeploy/sandbox-bench")
    if args.noop_hosts:
        noop_scale(args.noop_hosts, args.keep)
        return
    import specdeploy_sandbox as sandbox

    rows = []
    for size in (1, args.hosts):
        sandbox.down()
        sandbox.up(size)
        first = timed(deploy_command(args.mode, size))
        rows.append((f"first rollout, {size} host(s)", first))
        print(f"first rollout on {size} fresh host(s): {first:.1f}s", flush=True)
    noop = timed(deploy_command(args.mode, args.hosts))
    rows.append((f"no-op re-run, {args.hosts} hosts", noop))
    if not args.keep:
        sandbox.down()

    print(
        f"\nrollout timings ({args.mode}, {os.cpu_count()} CPU cores on the control node, "
        "sandbox hosts share them)"
    )
    for label, seconds in rows:
        print(f"  {label:<28} {seconds:8.1f} s")
    ratio = rows[1][1] / rows[0][1]
    print(
        f"  {args.hosts} vs 1 host: {ratio:.2f}x (target <= 2x); "
        f"no-op re-run {noop:.1f}s (target <= 5 s)"
    )


if __name__ == "__main__":
    main()
