"""`vllm bench serve` command lines and result summaries (the one place for both).

Every arm of every comparison takes its request set from `bench_args`, so the dataset, seed, lengths,
request rate, concurrency and prompt count are identical by construction."""

from __future__ import annotations


from .config import ServeConfig, Workload

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
        "0",
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
    elif w.dataset_path:
        args += ["--dataset-path", w.dataset_path]
    if label:
        args += ["--label", label]
    return args


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


def summarize(result: dict) -> dict:
    return {key: result.get(key) for key, _, _ in SUMMARY_FIELDS}


def format_summary(host: str, result: dict) -> str:
    lines = [f"{host}: smoke benchmark"]
    for key, label, fmt in SUMMARY_FIELDS:
        value = result.get(key)
        lines.append(
            f"  {label:<42} {fmt.format(value) if isinstance(value, (int, float)) else '-'}"
        )
    lines.append(
        "  (under speculation one streamed chunk can carry several tokens: ITL > TPOT is expected)"
    )
    return "\n".join(lines)
