"""Step 6: a short `vllm bench serve` from the host's own install against its local server."""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

from pyinfra import host, logger

from ..bench import bench_args, format_summary
from ..config import ServeConfig
from ..flags import launcher
from ..metrics import acceptance, spec_decode_counters
from .health import _curl, base_url
from ..render import env_file_path
from .remote import run, with_env_file


def reports_dir(host_name: str) -> Path:
    return Path(os.environ.get("SPECDEPLOY_REPORTS", "reports")) / host_name


def run_bench(cfg: ServeConfig, *, tokenizer_path: str, name: str, workload=None) -> dict:
    """Run one benchmark on the host, fetch its JSON to reports/<host>/NAME.json, return it
    with the server's spec-decode counter deltas attached."""
    remote_dir = f"{cfg.state_dir}/bench"
    filename = f"{name}.json"
    before = spec_decode_counters(_curl(cfg, "/metrics"))
    args = bench_args(cfg, base_url=base_url(cfg), tokenizer=tokenizer_path, result_dir=remote_dir,
                      result_filename=filename, workload=workload, label=name)
    env = f"HF_HOME={shlex.quote(cfg.hf_home)} HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 " + " ".join(
        f"{k}={shlex.quote(v)}" for k, v in cfg.vllm_env.items())
    started = time.monotonic()
    # An --api-key server needs it on the benchmark's requests too: `vllm bench` reads OPENAI_API_KEY; it
    # comes from the root-only env file, never argv.
    run(with_env_file(env_file_path(cfg), f'mkdir -p {remote_dir} && OPENAI_API_KEY="${{VLLM_API_KEY:-}}" '
                      f"{env} {shlex.join(launcher(cfg) + args)}"))
    elapsed = time.monotonic() - started
    after = spec_decode_counters(_curl(cfg, "/metrics"))
    local = reports_dir(host.name) / filename
    local.parent.mkdir(parents=True, exist_ok=True)
    host.get_file(f"{remote_dir}/{filename}", str(local))
    result = json.loads(local.read_text())
    result["specdeploy"] = {"server_counters": acceptance(before, after), "bench_seconds": round(elapsed, 1),
                            "command": launcher(cfg) + args}
    local.write_text(json.dumps(result, indent=1))
    return result


def smoke(cfg: ServeConfig, tokenizer_path: str) -> dict:
    result = run_bench(cfg, tokenizer_path=tokenizer_path, name=f"smoke-{time.strftime('%Y%m%dT%H%M%S')}")
    logger.info(format_summary(host.name, result))
    return result
