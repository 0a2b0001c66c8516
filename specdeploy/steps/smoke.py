"""Step 7: a short `vllm bench serve` from the host's own install against its local server.

`bench` is the one way any benchmark runs on a host (smoke, compare, tune, gate)."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

from pyinfra import host, logger

from ..argv import launcher
from ..bench import bench_args, format_summary, reports_root
from ..config import ServeConfig, Workload
from ..metrics import acceptance, prefix_cache_counters, spec_decode_counters
from ..on_host import read_text, sh
from ..timestamps import utc_iso, utc_stamp
from .health import base_url, request


def reports_dir(host_name: str) -> Path:
    return reports_root() / host_name


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
    result_path = f"{cfg.bench_dir}/{name}.json"
    before = request(cfg, "/metrics")
    args = bench_args(
        cfg,
        base_url=base_url(cfg),
        tokenizer=tokenizer,
        result_dir=cfg.bench_dir,
        result_filename=f"{name}.json",
        workload=workload,
        label=name,
    ) + list(extra)
    env = {"HF_HOME": cfg.hf_home, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    env |= cfg.vllm_env
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    started = time.monotonic()
    # An --api-key server needs the key on the benchmark's requests: `vllm bench` reads
    # OPENAI_API_KEY, which the shell reads from stdin (never argv, never a file).
    sh(
        f"IFS= read -r OPENAI_API_KEY; export OPENAI_API_KEY; "
        f"{assignments} {shlex.join(launcher(cfg) + args)}",
        stdin=(cfg.vllm_api_key or "") + "\n",
    )
    seconds = time.monotonic() - started
    after = request(cfg, "/metrics")
    text = read_text(result_path)
    sh(f"rm -f {shlex.quote(result_path)}", check=False)
    local.parent.mkdir(parents=True, exist_ok=True)
    result = json.loads(text)
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
        "finished_at": utc_iso(),
    }
    local.write_text(json.dumps(result, indent=1))
    return result


def smoke(cfg: ServeConfig, tokenizer_path: str) -> dict:
    name = f"smoke-{utc_stamp()}"
    result = bench(
        cfg, tokenizer=tokenizer_path, name=name, local=reports_dir(host.name) / f"{name}.json"
    )
    logger.info(format_summary(host.name, result))
    return result
