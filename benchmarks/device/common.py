"""Device-side helpers of every GPU plan's runner (benchmarks/*/device_run.py): log, start a server
and wait for /health, warm it, stop its process group, wait for the GPU's memory to be released.
Standard library only: they run under the GPU image's python3, imported as
`benchmarks.device.common` from the code tree `python -m benchmarks.device` carries.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except Exception:
        return False


def complete(port: int, model: str, max_tokens: int) -> None:
    body = json.dumps(
        {
            "model": model,
            "prompt": "def fibonacci(n): return",
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
    ).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        r.read()


def warm(port: int, model: str = "m") -> None:
    """One request, then 8 at once: Triton kernels of the speculative path and the graph shapes of
    the first batch sizes compile or load here, not inside a measured run."""
    complete(port, model, 32)
    threads = [threading.Thread(target=complete, args=(port, model, 16)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def start_server(
    argv: list[str], env: dict, log_path: str, port: int, deadline: float
) -> tuple[subprocess.Popen, str, float]:
    """Start `argv` in its own process group (stdout and stderr to log_path); wait until /health
    answers ("started"), the process exits ("refused") or the deadline passes ("timeout")."""
    t0 = time.time()
    with open(log_path, "w") as lf:
        proc = subprocess.Popen(
            argv, env=env, stdout=lf, stderr=subprocess.STDOUT, start_new_session=True
        )
    while True:
        if http_ok(f"http://127.0.0.1:{port}/health"):
            state = "started"
            break
        if proc.poll() is not None:
            state = "refused"
            break
        if time.time() > deadline:
            state = "timeout"
            break
        time.sleep(1)
    return proc, state, round(time.time() - t0, 1)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, to the server's process group (the engine core and workers too)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            continue


def gpu_used_mib(gpus: str | None = None) -> list[int]:
    cmd = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(
            cmd + (["-i", gpus] if gpus else []), capture_output=True, text=True, timeout=10
        ).stdout
        return [int(x) for x in out.split() if x.isdigit()]
    except Exception:
        return [-1]


def wait_gpu_free(gpus: str | None = None, below_mib: int = 1500, tries: int = 60) -> None:
    """Until every selected GPU holds less than below_mib (a stopped server's memory is released
    a little after its processes end)."""
    used = gpu_used_mib(gpus)
    for _ in range(tries):
        if all(0 <= u < below_mib for u in used):
            return
        time.sleep(0.5)
        used = gpu_used_mib(gpus)
    log(f"warning: GPU {gpus or 'all'} still holds memory: {used} MiB")
