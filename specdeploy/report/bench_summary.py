"""The summary of one `vllm bench serve` result: the figures the smoke step prints and the record
keeps, each shown only when enough requests, tokens, chunks or drafts stand behind it. Pure
functions over the typed BenchResult (record.py)."""

from __future__ import annotations

import statistics

from specdeploy.config.record import BenchResult, SmokeSummary, bench_result

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
