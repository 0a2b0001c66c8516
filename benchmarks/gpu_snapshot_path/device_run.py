"""On-device runner for benchmarks/gpu_snapshot_path (one H200, no systemd, no network).

For each form of the plan's argv (`snapshot_path`: what specdeploy renders since b05bf20, the
pinned draft named by its snapshot directory; `repo_id`: the form before, the draft named by repo
id), start `vllm serve` from that argv word for word, with the unit's Environment= (HF_HOME,
HF_HUB_OFFLINE=1, ...) and its WorkingDirectory, and record: seconds until /health answers,
/v1/models, the `vllm:spec_decode_*` counters of /metrics before and after greedy completions, the
completions, and the log lines that name the Hub, offline mode, the draft or an error.

argv[0] is the product's venv python (`/opt/specdeploy/venvs/vllm-0.26.0/bin/python`); here it is a
two-line shell script that execs the image's python3, which sees vLLM through PYTHONPATH (the
carried tree). Inherited HF_*, TRANSFORMERS_* and VLLM_* variables are dropped, as systemd would
not pass them.

Run by `python -m benchmarks.device run gpu_snapshot_path` (plan: plan.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

from benchmarks.device.common import gpu_used_mib, kill_group, log

GREP = re.compile(
    r"cannot reach|huggingface\.co|offline|snapshots/|models--|specdeploy-gpu/|draft|specul"
    r"|lm_head|revision|error|traceback|exception|warn|loading|model weights|took|startup",
    re.I,
)
PROMPT = "def fibonacci(n):"


def get(url: str, timeout: float = 10) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except Exception as error:
        return -1, repr(error)


def post(url: str, body: dict, timeout: float = 120) -> tuple[int, dict | str, float]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    t0 = time.time()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), round(time.time() - t0, 3)
    except Exception as error:
        return -1, repr(error), round(time.time() - t0, 3)


def spec_counters(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(("vllm:spec_decode", "vllm:generation_tokens", "vllm:prompt_tokens")):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def server_env(plan: dict, site: str) -> tuple[dict, list[str]]:
    dropped = [k for k in os.environ if k.startswith(("HF_", "TRANSFORMERS_", "VLLM_"))]
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env |= plan["env"] | {"PYTHONPATH": site, "PYTHONUNBUFFERED": "1"}
    return env, dropped


def run_form(plan: dict, form: str, env: dict, out: str, deadline: float) -> dict:
    argv, port = plan["forms"][form], plan["port"]
    base = f"http://127.0.0.1:{port}"
    log_path = os.path.join(out, f"{form}.serve.log")
    rec: dict = {"form": form, "argv": argv}
    t0 = time.time()
    with open(log_path, "w") as lf:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=plan["server_home"],
            stdout=lf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    state = "timeout"
    while time.time() < deadline:
        if get(f"{base}/health", 2)[0] == 200:
            state = "healthy"
            break
        if proc.poll() is not None:
            state = f"exited rc={proc.returncode}"
            break
        time.sleep(0.5)
    rec |= {"state": state, "seconds_to_healthy": round(time.time() - t0, 1)}
    log(f"{form}: {state} after {rec['seconds_to_healthy']} s")
    if state == "healthy":
        rec["gpu_used_mib"] = gpu_used_mib()[0]
        rec["models"] = json.loads(get(f"{base}/v1/models")[1])
        rec["metrics_before"] = spec_counters(get(f"{base}/metrics")[1])
        rec["completions"] = []
        for max_tokens in (64, 64, 128):
            status, body, secs = post(
                f"{base}/v1/completions",
                {
                    "model": plan["served_model_name"],
                    "prompt": PROMPT,
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                },
            )
            rec["completions"].append({"status": status, "seconds": secs, "response": body})
            log(f"  completion {max_tokens}: {status} in {secs} s")
        rec["metrics_after"] = spec_counters(get(f"{base}/metrics")[1])
        before, after = rec["metrics_before"], rec["metrics_after"]
        rec["metrics_delta"] = {
            k: after[k] - before.get(k, 0.0) for k in after if k.startswith("vllm:spec_decode")
        }
        rec["ps"] = subprocess.run(
            ["bash", "-c", "ps -e -o pid=,ppid=,rss=,args= | grep -iE 'vllm|VLLM' | grep -v grep"],
            capture_output=True,
            text=True,
        ).stdout.splitlines()
    kill_group(proc)
    for _ in range(60):
        if 0 <= gpu_used_mib()[0] < 2000:
            break
        time.sleep(0.5)
    lines = open(log_path, errors="replace").read().splitlines()
    rec["log_lines"] = len(lines)
    rec["log_grep"] = [ln[:600] for ln in lines if GREP.search(ln)][:400]
    for key, pattern in (
        ("cannot_reach", "Cannot reach"),
        ("huggingface_co", "huggingface.co"),
        ("offline", "offline"),
        ("draft_path", plan["draft_snapshot"]),
        ("draft_repo_id", plan["draft_repo"]),
        ("traceback", "Traceback"),
    ):
        rec[f"count_{key}"] = sum(pattern.lower() in ln.lower() for ln in lines)
    return rec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--site", required=True)
    ap.add_argument("--budget", type=float, default=480)
    ap.add_argument("--forms", default="snapshot_path,repo_id")
    args = ap.parse_args()
    t_start = time.time()
    plan = json.load(open(args.plan))
    draft = next(r for r, m in plan["models"].items() if m["role"] == "draft")
    plan["draft_repo"] = draft
    plan["draft_snapshot"] = (
        f"{plan['hf_home']}/hub/models--{draft.replace('/', '--')}/snapshots/"
        f"{plan['models'][draft]['sha']}"
    )
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(plan["server_home"], exist_ok=True)
    python = plan["vllm_cli"][0]
    os.makedirs(os.path.dirname(python), exist_ok=True)
    with open(python, "w") as f:
        f.write(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    os.chmod(python, 0o755)
    env, dropped = server_env(plan, args.site)
    summary: dict = {"dropped_env": dropped, "forms": {}, "plan_env": plan["env"]}
    summary["versions"] = subprocess.run(
        [
            python,
            "-c",
            "import vllm, torch, transformers, huggingface_hub as h; print(vllm.__version__, "
            "torch.__version__, transformers.__version__, h.__version__)",
        ],
        env=env,
        capture_output=True,
        text=True,
    ).stdout.split()
    log(f"versions vllm torch transformers huggingface_hub: {summary['versions']}")
    for form in args.forms.split(","):
        left = args.budget - (time.time() - t_start)
        if left < 150:
            log(f"{form}: skipped, {left:.0f} s of budget left")
            summary["forms"][form] = {"state": f"skipped ({left:.0f} s left)"}
            continue
        summary["forms"][form] = run_form(plan, form, env, args.out, t_start + args.budget - 30)
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
    summary["runner_seconds"] = round(time.time() - t_start, 1)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    log(f"done in {summary['runner_seconds']} s")


if __name__ == "__main__":
    main()
