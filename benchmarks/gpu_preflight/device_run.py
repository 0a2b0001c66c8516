"""On-device runner for benchmarks/gpu_preflight (one H200): a host whose own server is running asks
the preflight about its own re-deploy, then restarts that server.

The device has no systemd, so the unit is emulated the way systemd runs one: the server is started
inside a cgroup of its own named after the unit (`/sys/fs/cgroup/specdeploy-vllm.service`, cgroup
v2; its engine process, a child, lands there too), and a `systemctl` shim on PATH answers the one
question the fact asks, `systemctl show -p ControlGroup --value UNIT`. The `Accelerators` fact's
command then runs unchanged (plan.json's `command`). Where the cgroup cannot be made, the fact's
unit part is replaced by the server's process group (`mode: "pids"`, recorded).

A plan with `layouts` (box_plan.py: a whole box, issue 23) also has each layout decided by
`instances.expand` on the GPU list the fact read at idle: the split, its problems, the idle GPUs.

States, each with the fact's raw output and `preflight.evaluate` of every planned config on it:
idle; own server running; own server + another process holding HOG_GIB; after the restart (the old
server stopped, the same config started again, healthy: the check `verify_and_record` makes); after
both stopped. The `ModelSnapshot` fact's command gives the target and draft dicts.

Run by `python -m benchmarks.device run gpu_preflight` (plan: plan.py) or `... run gpu_box`
(box_plan.py), which puts vLLM's tree and the carried specdeploy with its pyinfra stand-in on
PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time

from benchmarks.device.common import complete, kill_group, log, start_server
from specdeploy.checks.preflight import evaluate
from specdeploy.config.schema import config_from_data
from specdeploy.host.facts.nvidia import parse_accelerators
from specdeploy.render import instances

LOGS = "/tmp/gp_logs"
SHIM = "/tmp/gp_bin"
CGROUP = "/sys/fs/cgroup"
SYSTEMCTL = """#!/bin/sh
# systemd stand-in for the Accelerators fact: `systemctl show -p ControlGroup --value UNIT`
for unit; do :; done
[ -d "/sys/fs/cgroup/$unit" ] && echo "/$unit"
exit 0
"""


def ram() -> dict:
    values = {}
    for line in open("/proc/meminfo"):
        name, amount = line.split(":")
        values[name] = int(amount.split()[0]) * 1024
    return {"total": values["MemTotal"], "available": values["MemAvailable"]}


def sh(command: str) -> list[str]:
    env = os.environ | {"PATH": f"{SHIM}:{os.environ['PATH']}"}
    env.pop("CUDA_VISIBLE_DEVICES", None)  # the fact runs in the deploy user's plain shell
    return subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, env=env
    ).stdout.splitlines()


class Runner:
    def __init__(self, plan: dict, out: str):
        self.plan, self.out = plan, out
        self.states: list[dict] = []
        self.mode = "none"
        self.server_pgid: int | None = None
        self.models: dict = {}
        self.summary: dict = {"plan_units": plan["units"], "states": self.states, "events": []}

    def event(self, msg: str, **more) -> None:
        log(msg)
        self.summary["events"].append({"t": round(time.time(), 1), "msg": msg, **more})

    def command(self) -> str:
        if self.mode != "pids" or self.server_pgid is None:
            return self.plan["command"]
        # no cgroup: the server's process group in place of the unit's cgroup PIDs
        unit = self.plan["unit"]
        pids = f"ps -e -o pid=,pgid= | awk '$2 == {self.server_pgid} {{print $1}}'"
        rest = "".join(f'; echo "@@unit {u}"' for u in self.plan["units"] if u != unit)
        return f'{self.plan["base_command"]}; echo "@@unit {unit}"; {pids}{rest}'

    def state(self, name: str) -> dict:
        command = self.command()
        output = sh(command)
        apps = sh(
            "nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid,used_memory "
            "--format=csv,noheader,nounits"
        )
        info = parse_accelerators(output)
        without_units = parse_accelerators([ln for ln in output if not ln.startswith("@@unit")])
        rec = {
            "state": name,
            "mode": self.mode,
            "command": command,
            "output": output,
            "compute_apps_with_names": apps,
            "ps": sh(
                "ps -e -o pid=,ppid=,pgid=,rss=,args= | grep -iE 'vllm|python3 -c' | "
                "grep -v grep | cut -c1-160"
            ),
            "fact": info.model_dump(),
            "evaluations": {},
        }
        for cname, data in self.plan["configs"].items():
            cfg = config_from_data(data)
            for label, acc in (("fact", info), ("without_units", without_units)):
                res = evaluate(cfg, self.models["target"], self.models["draft"], acc, ram())
                rec["evaluations"][f"{cname}:{label}"] = {
                    "fits": not res.problems,
                    "problems": res.problems,
                    "warnings": res.warnings,
                    "memory_in_use": res.memory.get("memory_in_use"),
                    "kv_tokens": res.memory.get("kv_tokens"),
                    "device_memory_used_bytes": res.memory.get("device_memory_used_bytes"),
                    "device_memory_other_bytes": res.memory.get("device_memory_other_bytes"),
                    "device_memory_own_bytes": res.memory.get("device_memory_own_bytes"),
                }
        self.states.append(rec)
        self.save()
        ev = rec["evaluations"]
        log(
            f"state {name}: used {[g['memory_used_bytes'] for g in rec['fact']['gpus']]}, "
            f"own pids {info.own_pids}; redeploy fits={ev['redeploy:fact']['fits']} "
            f"({ev['redeploy:fact']['memory_in_use']}); without units "
            f"fits={ev['redeploy:without_units']['fits']}; util092 "
            f"fits={ev['util092:fact']['fits']}"
        )
        for key in ("redeploy:fact", "redeploy:without_units", "util092:fact", "util060:fact"):
            for p in ev[key]["problems"]:
                log(f"  {key}: {p}")
        return rec

    def save(self) -> None:
        with open(os.path.join(self.out, "summary.json"), "w") as f:
            json.dump(self.summary, f, indent=1)

    def start(self, label: str, deadline: float):
        unit_cg = os.path.join(CGROUP, self.plan["unit"])
        wrap = f'echo $$ > {unit_cg}/cgroup.procs 2>/dev/null; exec "$@"'
        argv = [
            "sh",
            "-c",
            wrap,
            "sh",
            sys.executable,
            "-m",
            "vllm.entrypoints.cli.main",
            "serve",
            *self.plan["serve"],
        ]
        env = os.environ | self.plan["env"]
        proc, state, secs = start_server(
            argv, env, f"{LOGS}/{label}.serve.log", self.plan["port"], deadline
        )
        self.server_pgid = proc.pid
        in_cg = (
            os.path.exists(f"{unit_cg}/cgroup.procs")
            and str(proc.pid) in open(f"{unit_cg}/cgroup.procs").read().split()
        )
        self.mode = "cgroup" if in_cg else "pids"
        ok = False
        if state == "started":
            try:
                complete(self.plan["port"], self.plan["served_model_name"], 16)
                ok = True
            except Exception as error:
                self.event(f"{label}: completion failed: {error!r}")
        self.event(
            f"{label}: vLLM {state} after {secs} s, completion ok={ok}, mode {self.mode}",
            server=label,
            vllm=state,
            ready_s=secs,
            completion_ok=ok,
        )
        return proc, state == "started" and ok


def hog(gib: int) -> subprocess.Popen:
    code = (
        f"import torch,time; x=torch.empty({gib}<<30,dtype=torch.uint8,device='cuda'); "
        "x.fill_(1); torch.cuda.synchronize(); print('held',flush=True); time.sleep(3600)"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        env=os.environ | {"CUDA_VISIBLE_DEVICES": "0"},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    p.stdout.readline()
    return p


def used_mib() -> int:
    out = sh("nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits")
    return int(out[0]) if out and out[0].strip().isdigit() else -1


def wait_below(mib: int, tries: int = 120) -> int:
    for _ in range(tries):
        now = used_mib()
        if 0 <= now < mib:
            return now
        time.sleep(0.5)
    return used_mib()


def decide_layouts(layouts: dict, gpus: list[dict]) -> dict:
    """What the deploy's planning decides for each box layout on this host's GPUs (the fact's)."""
    available = [g["index"] for g in gpus]
    out = {}
    for name, data in layouts.items():
        cfg = config_from_data(data)
        layout = instances.expand(cfg, available)
        out[name] = {
            "gpus": available,
            "problems": layout.problems,
            "idle": layout.idle,
            "uneven_note": instances.uneven_note(cfg, layout),
            "instances": [
                {
                    "name": m.name,
                    "port": m.port,
                    "devices": list(m.devices),
                    "env": {k: m.cfg.vllm_env.get(k) for k in (instances.GPU_ENV,)},
                }
                for m in layout.instances
            ],  # fmt: skip
            "idle_without_instances": (
                instances.idle_without_instances(cfg, available) if cfg.instances is None else None
            ),
        }
        log(f"layout {name}: {out[name]['instances'] or out[name]['problems']}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=480)
    args = ap.parse_args()
    t0 = time.time()
    deadline = t0 + args.budget
    os.makedirs(LOGS, exist_ok=True)
    os.makedirs(SHIM, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    with open(f"{SHIM}/systemctl", "w") as f:
        f.write(SYSTEMCTL)
    os.chmod(f"{SHIM}/systemctl", 0o755)
    plan = json.load(open(args.plan))
    run = Runner(plan, args.out)
    try:
        os.makedirs(os.path.join(CGROUP, plan["unit"]), exist_ok=True)
        run.event(f"cgroup {plan['unit']} made")
    except OSError as error:
        run.event(f"no cgroup of our own ({error!r}): the server's process group stands in")
    for role, command in plan["model_facts_commands"].items():
        try:
            run.models[role] = json.loads("\n".join(sh(command)))
        except ValueError:
            run.models[role] = None
        if not run.models[role]:
            run.models[role] = plan["model_facts_recorded"][role]
            run.event(f"ModelSnapshot fact failed for the {role}: the recorded facts stand in")
    run.summary["model_facts"] = run.models
    idle = run.state("idle")
    if plan.get("layouts"):
        run.summary["layouts"] = decide_layouts(plan["layouts"], idle["fact"]["gpus"])
        run.save()
    first, ok = run.start("first", deadline - 200)
    held = None
    try:
        if not ok:
            return
        run.state("own_server")
        held = hog(plan["hog_gib"])
        run.event(f"another process holds {plan['hog_gib']} GiB (pid {held.pid})")
        run.state(f"own_server_plus_other_{plan['hog_gib']}g")
        # The restart, as the unit step does it: stop the old server, start the same config.
        before = used_mib()
        kill_group(first)
        left = wait_below(before - 70000)  # the server held ~77 GiB
        run.event(f"old server stopped; {left} MiB in use")
        run.state(f"other_{plan['hog_gib']}g_only")
        second, ok = run.start("restart", deadline - 30)
        try:
            if ok:
                run.state("after_restart")  # what verify_and_record's preflight reads
        finally:
            kill_group(second)
    finally:
        kill_group(first)
        if held:
            kill_group(held)
        run.event(f"stopped; {wait_below(1500)} MiB in use")
        run.mode = "none"
        run.server_pgid = None
        run.state("after_stop")
        run.summary["seconds"] = round(time.time() - t0, 1)
        run.save()
        with tarfile.open(os.path.join(args.out, "logs.tar.gz"), "w:gz") as tar:
            tar.add(LOGS, arcname="logs")
        log(f"done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
