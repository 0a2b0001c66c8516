"""Step 6: a short `vllm bench serve` from the host's own install against its local server.

`bench` is the one way any benchmark runs on a host (smoke, compare, tune, gate)."""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

from pyinfra import host, logger

from ..bench import bench_args, format_summary
from ..config import ServeConfig, Workload
from ..flags import launcher
from ..metrics import acceptance, prefix_cache_counters, spec_decode_counters
from ..render import env_file_path
from .health import _curl, base_url
from .remote import run, with_env_file


def reports_dir(host_name: str) -> Path:
    return Path(os.environ.get("SPECDEPLOY_REPORTS", "reports")) / host_name


def bench(
    cfg: ServeConfig,
    *,
    tokenizer: str,
    name: str,
    local: Path,
    workload: Workload | None = None,
    extra: list[str] | tuple[str, ...] = (),
    meta: dict | None = None,
) -> dict:
    """One `vllm bench serve` on the host against the running server; its JSON is fetched to `local`
    with {"specdeploy": {server_counters, prefix_cache, command, ...meta}} added."""
    remote_dir = f"{cfg.state_dir}/bench"
    filename = f"{name}.json"
    before = _curl(cfg, "/metrics")
    args = bench_args(
        cfg,
        base_url=base_url(cfg),
        tokenizer=tokenizer,
        result_dir=remote_dir,
        result_filename=filename,
        workload=workload,
        label=name,
    ) + list(extra)
    env = f"HF_HOME={shlex.quote(cfg.hf_home)} HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 " + " ".join(
        f"{k}={shlex.quote(v)}" for k, v in cfg.vllm_env.items()
    )
    started = time.monotonic()
    # An --api-key server needs the key on the benchmark's requests too: `vllm bench` reads OPENAI_API_KEY;
    # it comes from the root-only env file, never argv.
    run(
        with_env_file(
            env_file_path(cfg),
            f'mkdir -p {remote_dir} && OPENAI_API_KEY="${{VLLM_API_KEY:-}}" '
            f"{env} {shlex.join(launcher(cfg) + args)}",
        )
    )
    seconds = time.monotonic() - started
    after = _curl(cfg, "/metrics")
    local.parent.mkdir(parents=True, exist_ok=True)
    host.get_file(f"{remote_dir}/{filename}", str(local))
    run(f"rm -f {remote_dir}/{filename}", check=False)
    result = json.loads(local.read_text())
    pc_before, pc_after = prefix_cache_counters(before), prefix_cache_counters(after)
    prefix = {k: pc_after.get(k, 0.0) - pc_before.get(k, 0.0) for k in pc_after}
    result["specdeploy"] = {
        **(meta or {}),
        "host": host.name,
        "server_counters": acceptance(spec_decode_counters(before), spec_decode_counters(after)),
        "prefix_cache": prefix
        | {"hit_rate": prefix["hits"] / prefix["queries"] if prefix.get("queries") else None},
        "bench_seconds": round(seconds, 1),
        "command": launcher(cfg) + args,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    local.write_text(json.dumps(result, indent=1))
    return result


def smoke(cfg: ServeConfig, tokenizer_path: str) -> dict:
    name = f"smoke-{time.strftime('%Y%m%dT%H%M%S')}"
    result = bench(
        cfg, tokenizer=tokenizer_path, name=name, local=reports_dir(host.name) / f"{name}.json"
    )
    logger.info(format_summary(host.name, result))
    return result
