"""`vllm bench serve`: its command lines and the one way it runs on a host (its result's summary:
bench_summary.py).

Every arm of every comparison takes its request set from `bench_args`, so the dataset, seed,
lengths, request rate, concurrency and prompt count are identical by construction."""

from __future__ import annotations

import json
import math
import shlex
import time
from pathlib import Path

from pyinfra import host

from . import datasets, server
from .config import ServeConfig, Workload
from .metrics import acceptance, prefix_cache_counters, spec_decode_counters
from .on_host import TIME_LIMIT_GRACE_S, HostCommandError, read_text, sh, with_time_limit
from .record import BenchResult, BenchRun
from .timestamps import utc_iso

PERCENTILE_METRICS = "ttft,tpot,itl,e2el"


METRIC_PERCENTILES = "50,90,99"


def bench_args(
    cfg: ServeConfig,
    *,
    base_url: str,
    tokenizer: str,
    result_dir: str,
    result_filename: str,
    workload: Workload | None = None,
    label: str | None = None,
) -> list[str]:
    w = workload or cfg.workload
    args = [
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        base_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        cfg.effective_served_name,
        "--served-model-name",
        cfg.effective_served_name,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        w.dataset,
        "--num-prompts",
        str(w.num_prompts),
        "--request-rate",
        str(w.request_rate),
        "--max-concurrency",
        str(w.max_concurrency),
        "--seed",
        str(w.seed),
        "--temperature",
        str(w.temperature),
        "--top-p",
        str(w.top_p),
        "--ignore-eos",  # every request produces output_len tokens, so arms do equal work
        "--percentile-metrics",
        PERCENTILE_METRICS,
        "--metric-percentiles",
        METRIC_PERCENTILES,
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",  # keep per-request latencies: noise bands need the samples
        "--result-dir",
        result_dir,
        "--result-filename",
        result_filename,
    ]
    if w.dataset == "random":
        args += ["--random-input-len", str(w.prompt_len), "--random-output-len", str(w.output_len)]
    elif w.dataset in datasets.SHIPPED and w.dataset_path:  # the copy the deploy shipped
        args += datasets.bench_dataset_args(w.dataset, w.dataset_path, w.output_len)
    if label:
        args += ["--label", label]
    return args


def bench_time_limit(cfg: ServeConfig, workload: Workload | None = None) -> int:
    """Seconds one `vllm bench serve` may take: every output token of the request set at the floor
    rate `smoke_min_tokens_per_s`, plus `health_timeout_s` (what a server may take to get going:
    first requests compile kernels and warm caches). A run past it is a wedged GPU or server."""
    w = workload or cfg.workload
    return math.ceil(w.num_prompts * w.output_len / cfg.smoke_min_tokens_per_s) + (
        cfg.health_timeout_s
    )


class BenchTimeout(RuntimeError):
    pass


def bench_timeout_message(cfg: ServeConfig, name: str, workload: Workload | None = None) -> str:
    w = workload or cfg.workload
    return (
        f"{host.name}: benchmark {name}: `vllm bench serve` ran past "
        f"{bench_time_limit(cfg, workload)} s = {w.num_prompts} prompts x {w.output_len} output "
        f"tokens / smoke_min_tokens_per_s {cfg.smoke_min_tokens_per_s} + health_timeout_s "
        f"{cfg.health_timeout_s} (stopped); lower smoke_min_tokens_per_s in the host's data if "
        "the host is this slow, else the server is wedged (see its journal)"
    )


def run_bench(
    cfg: ServeConfig,
    *,
    tokenizer: str,
    name: str,
    local: Path,
    workload: Workload | None = None,
    extra: list[str] | tuple[str, ...] = (),
    meta: dict | None = None,
) -> BenchResult:
    """The one way any benchmark runs on a host (smoke, compare, tune, gate): one `vllm bench
    serve` on the host against the running server; its JSON is fetched to `local` with
    specdeploy's part (BenchRun: server counters, prefix cache, command, ...meta) added."""
    result_path = f"{cfg.bench_dir}/{name}.json"
    # the command line first (bench's own work), then the host: counters, benchmark, counters
    limit, message = bench_time_limit(cfg, workload), bench_timeout_message(cfg, name, workload)
    args = bench_args(
        cfg,
        base_url=cfg.base_url,
        tokenizer=tokenizer,
        result_dir=cfg.bench_dir,
        result_filename=f"{name}.json",
        workload=workload,
        label=name,
    ) + list(extra)
    argv = cfg.vllm_cli + args
    env = {"HF_HOME": cfg.hf_home, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    env |= cfg.vllm_env
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    before = server.request(cfg, "/metrics")
    started = time.monotonic()
    # An --api-key server needs the key on the benchmark's requests: `vllm bench` reads
    # OPENAI_API_KEY, which the shell reads from stdin (never argv, never a file). The host's
    # `timeout` stops it at the limit; pyinfra's is the backstop for a connection that hangs.
    command = (
        f"IFS= read -r OPENAI_API_KEY; export OPENAI_API_KEY; {assignments} {shlex.join(argv)}"
    )
    try:
        sh(
            with_time_limit(command, limit, message),
            stdin=(cfg.vllm_api_key or "") + "\n",
            timeout=limit + TIME_LIMIT_GRACE_S,
        )
    except TimeoutError:
        raise BenchTimeout(message) from None
    except HostCommandError as error:
        if message in str(error).partition("failed:\n")[2]:  # on stderr, not in the command
            raise BenchTimeout(message) from None
        raise
    seconds = time.monotonic() - started
    after = server.request(cfg, "/metrics")
    text = read_text(result_path)
    sh(f"rm -f {shlex.quote(result_path)}", check=False)
    local.parent.mkdir(parents=True, exist_ok=True)
    pc_before, pc_after = prefix_cache_counters(before), prefix_cache_counters(after)
    prefix = {k: pc_after.get(k, 0.0) - pc_before.get(k, 0.0) for k in pc_after}
    run = BenchRun.model_validate(
        {
            **(meta or {}),
            "host": host.name,
            "server_counters": acceptance(
                spec_decode_counters(before), spec_decode_counters(after)
            ),
            "prefix_cache": prefix
            | {"hit_rate": prefix["hits"] / prefix["queries"] if prefix.get("queries") else None},
            "bench_seconds": round(seconds, 1),
            "command": argv,
            "finished_at": utc_iso(),
        }
    )
    result = BenchResult.model_validate(json.loads(text) | {"specdeploy": run})
    local.write_text(result.to_json())
    return result
