"""On-device runner of the H200 recording (README.md): make the machine a host as a deploy leaves
it (the service user and its home, the venv at cfg.venv seeing the unpacked vLLM, the HF cache
the plan's setup wrote, readable by the service's group), then run the product's proof command
(render.py's `command`) with each rendered request on stdin; the requests, the command, what was
rendered and each case's stdout, stderr and exit status land in OUT.

Run by `python -m benchmarks.device run host_proof` (plan: render.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

from benchmarks.device.common import log

VENV = "/opt/specdeploy/venvs/vllm-0.26.0"
CACHE = "/var/lib/specdeploy/cache"


def sh(command: str) -> None:
    subprocess.run(["sh", "-c", command], check=True)


def make_host(site: str, hf: str) -> None:
    sh(f"chmod -R a+rX {site}")
    sh(f"id vllm >/dev/null 2>&1 || useradd --system --home-dir {CACHE} vllm")
    sh(f"mkdir -p {CACHE} && chown vllm:vllm {CACHE}")
    if not os.path.exists(f"{VENV}/bin/python"):
        sh(f"python3 -m venv --system-site-packages {VENV}")
    # the venv sees the unpacked vLLM and the image's torch (found through the image's PYTHONPATH,
    # which the proof's empty environment does not have)
    purelib = subprocess.run(
        [f"{VENV}/bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, env={},
    ).stdout.strip()  # fmt: skip
    import torch

    torch_dir = os.path.dirname(os.path.dirname(torch.__file__))
    Path(purelib, "specdeploy-pack.pth").write_text(f"{site}\n{torch_dir}\n")
    sh(f"chgrp -R vllm {hf} && chmod -R g+rX,o-rwx {hf}")
    version = subprocess.run(
        [f"{VENV}/bin/python", "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
        capture_output=True, text=True, env={},
    ).stdout.strip()  # fmt: skip
    log(f"host made: venv {VENV} sees vllm {version}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--site", required=True)
    ap.add_argument("--hf", required=True)
    args = ap.parse_args()
    plan = json.loads(Path(args.plan).read_text())
    out = Path(args.out)
    make_host(args.site, args.hf)
    (out / "command.sh").write_text(plan["command"] + "\n")
    (out / "rendered.json").write_text(json.dumps(plan["rendered"], indent=1) + "\n")
    for case in ("good", "bad"):
        request = json.dumps(plan[case], indent=1) + "\n"
        (out / f"{case}.json").write_text(request)
        started = time.time()
        with open(out / f"{case}.out", "w") as stdout, open(out / f"{case}.err", "w") as stderr:
            done = subprocess.run(
                ["bash", "-c", plan["command"]], input=request, text=True,
                stdout=stdout, stderr=stderr,
            )  # fmt: skip
        line = f"{case}: exit {done.returncode} in {time.time() - started:.0f} s"
        with open(out / "exit.txt", "a") as f:
            f.write(line + "\n")
        log(line)
        try:
            report = json.loads((out / f"{case}.out").read_text())
            log(f"  {report['ok']} {report['stage']} {report['error']} {report['keys']}")
        except (ValueError, KeyError) as error:
            log(f"  no report: {error!r}")


if __name__ == "__main__":
    main()
