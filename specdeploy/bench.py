"""`vllm bench serve`: its command lines, the one way it runs on a host, and its result summaries.

Every arm of every comparison takes its request set from `bench_args`, so the dataset, seed,
lengths, request rate, concurrency and prompt count are identical by construction."""

from __future__ import annotations

import json
import math
import shlex
import statistics
import time
from pathlib import Path

from pyinfra import host

from . import datasets, server
from .argv import launcher
from .config import ServeConfig, Workload
from .metrics import acceptance, prefix_cache_counters, spec_decode_counters
from .on_host import TIME_LIMIT_GRACE_S, HostCommandError, read_text, sh, with_time_limit
from .record import BenchResult, BenchRun, SmokeSummary, bench_result
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
    argv = launcher(cfg) + args
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


SUMMARY_FIELDS = [
    ("completed", "requests completed", "{:.0f}"),
    ("request_throughput", "request throughput (req/s)", "{:.2f}"),
    ("output_throughput", "output throughput (tok/s)", "{:.1f}"),
    ("median_ttft_ms", "TTFT median (ms)", "{:.1f}"),
    ("p99_ttft_ms", "TTFT p99 (ms)", "{:.1f}"),
    ("median_tpot_ms", "TPOT median (ms)  per output token", "{:.2f}"),
    ("median_itl_ms", "ITL median (ms)   between streamed chunks", "{:.2f}"),
    ("median_e2el_ms", "E2E latency median (ms)", "{:.1f}"),
    ("spec_decode_acceptance_rate", "acceptance rate (%)", "{:.1f}"),
    ("spec_decode_acceptance_length", "mean acceptance length", "{:.2f}"),
]
PER_POSITION_KEY = "spec_decode_per_position_acceptance_rates"

# How much a figure needs behind it before a summary shows it (below: "not enough data (why)").
MIN_OUTPUT_TOKENS_PER_REQUEST = 8  # TPOT divides the decode time by output tokens - 1
MIN_CHUNKS_PER_REQUEST = 4  # fewer: the output reached the client (almost) at once, TPOT ~ 0
MIN_CHUNK_GAPS = 32  # ITL is a median over the gaps between streamed chunks
MIN_DRAFTS = 32  # acceptance figures are ratios over verified drafts
MIN_REQUESTS_FOR_P99 = 20  # below this the "p99" is just the slowest request


def drafts_of(result: BenchResult | dict) -> float | None:
    """Drafts the target verified during the run (the benchmark's own count, else the server's
    counters as specdeploy read them); None when the server was not speculating."""
    result = bench_result(result)
    if isinstance(result.spec_decode_num_drafts, (int, float)):
        return result.spec_decode_num_drafts
    counters = result.counters
    return counters.drafts if counters.draft_tokens else None


def per_position_acceptance(result: BenchResult | dict) -> list[float] | None:
    """The acceptance curve over draft positions: the benchmark's own figures, else the server's."""
    result = bench_result(result)
    rates = result.spec_decode_per_position_acceptance_rates
    if rates:
        return list(rates)
    return result.counters.per_position or None


def not_enough_data(result: BenchResult | dict) -> dict[str, str]:
    """{summary key: why} for every figure computed from too few requests, tokens, chunks or drafts
    to mean anything (a summary shows the reason instead of the number)."""
    why: dict[str, str] = {}
    result = bench_result(result)
    completed = result.completed or 0
    if not completed:
        reason = "no request completed"
        return {key: reason for key, _, _ in SUMMARY_FIELDS if key != "completed"} | {
            PER_POSITION_KEY: reason
        }
    if completed < MIN_REQUESTS_FOR_P99:
        why["p99_ttft_ms"] = (
            f"{completed} requests: their p99 is the slowest one; needs >= {MIN_REQUESTS_FOR_P99}"
        )
    output_lens = [n for n in result.output_lens or [] if n]
    tokens = (
        statistics.median(output_lens)
        if output_lens
        else (result.total_output_tokens or 0) / completed
    )
    itls = [gaps for gaps in result.itls or [] if gaps is not None]
    chunks = statistics.median([len(gaps) + 1 for gaps in itls]) if itls else None
    if tokens < MIN_OUTPUT_TOKENS_PER_REQUEST:
        why["median_tpot_ms"] = (
            f"{tokens:.0f} output tokens per request; needs >= {MIN_OUTPUT_TOKENS_PER_REQUEST}"
        )
    elif chunks is not None and chunks < MIN_CHUNKS_PER_REQUEST:
        why["median_tpot_ms"] = (
            f"{chunks:.0f} streamed chunks per request: the output arrived (almost) at once; "
            f"needs >= {MIN_CHUNKS_PER_REQUEST}"
        )
    gaps = sum(len(g) for g in itls) if itls else None
    if gaps is not None and gaps < MIN_CHUNK_GAPS:
        why["median_itl_ms"] = (
            f"{gaps} gaps between streamed chunks in all requests; needs >= {MIN_CHUNK_GAPS}"
        )
    drafts = drafts_of(result)
    if drafts is not None and drafts < MIN_DRAFTS:
        reason = f"{drafts:.0f} drafts verified; needs >= {MIN_DRAFTS}"
        for key in (
            "spec_decode_acceptance_rate",
            "spec_decode_acceptance_length",
            PER_POSITION_KEY,
        ):
            why[key] = reason
    return why


def summarize(result: BenchResult | dict) -> SmokeSummary:
    """The summary figures as the record keeps them: each number, the acceptance curve, and why any
    of them is too thin to trust."""
    result = bench_result(result)
    return SmokeSummary.model_validate(
        {key: result.figure(key) for key, _, _ in SUMMARY_FIELDS}
        | {
            "per_position_acceptance": per_position_acceptance(result),
            "not_enough_data": not_enough_data(result),
        }
    )


def format_curve(rates: list[float]) -> str:
    """Per-position acceptance as one line: "pos1 0.78  pos2 0.55  pos3 0.37"."""
    return "  ".join(f"pos{i + 1} {rate:.2f}" for i, rate in enumerate(rates))


def format_summary(host: str, result: BenchResult | dict) -> str:
    result = bench_result(result)
    thin = not_enough_data(result)
    lines = [f"{host}: smoke benchmark"]
    for key, label, fmt in SUMMARY_FIELDS:
        value = result.figure(key)
        if key in thin:
            shown = f"not enough data ({thin[key]})"
        elif isinstance(value, (int, float)):
            shown = fmt.format(value)
        else:
            shown = "-"
        lines.append(f"  {label:<42} {shown}")
    curve = per_position_acceptance(result)
    if PER_POSITION_KEY in thin:
        shown = f"not enough data ({thin[PER_POSITION_KEY]})"
    else:
        shown = format_curve(curve) if curve else "-"
    lines.append(f"  {'acceptance by draft position':<42} {shown}")
    lines.append(
        "  (under speculation one streamed chunk can carry several tokens: ITL > TPOT is expected)"
    )
    return "\n".join(lines)
