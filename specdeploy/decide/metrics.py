"""Read vLLM's Prometheus /metrics text (parsed by prometheus_client, not by hand)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

PREFIX = "vllm:spec_decode_"


def spec_decode_counters(text: str) -> dict[str, float]:
    """{'num_drafts': ..., 'num_draft_tokens': ..., 'num_accepted_tokens': ...} summed over label
    sets (per-position counters are kept as 'num_accepted_tokens_per_pos[i]')."""
    counters: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIX):
            continue
        short = family.name[len(PREFIX) :]
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            key = short
            if "position" in sample.labels:
                key = f"{short}[{sample.labels['position']}]"
            counters[key] = counters.get(key, 0.0) + sample.value
    return counters


def acceptance(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """Acceptance rate (accepted / proposed draft tokens) and mean acceptance length
    (1 + accepted / drafts: tokens emitted per target step) between two counter snapshots."""
    drafts = after.get("num_drafts", 0) - before.get("num_drafts", 0)
    proposed = after.get("num_draft_tokens", 0) - before.get("num_draft_tokens", 0)
    accepted = after.get("num_accepted_tokens", 0) - before.get("num_accepted_tokens", 0)
    return {
        "drafts": drafts,
        "draft_tokens": proposed,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / proposed if proposed else None,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        "per_position": per_position_acceptance(before, after),
    }


def prefix_cache_counters(text: str) -> dict[str, float]:
    """vllm:prefix_cache_{queries,hits}_total summed over label sets."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("vllm:prefix_cache_"):
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    short = sample.name[len("vllm:prefix_cache_") : -len("_total")]
                    out[short] = out.get(short, 0.0) + sample.value
    return out


# --------------------------------------------------------------------------------------------------
# Live figures for `specdeploy status`: counters, gauges and histograms from two /metrics scrapes.


def samples(text: str) -> dict[str, list]:
    """{sample name: [prometheus_client Sample, ...]} for every sample in a /metrics text
    (`_created` samples dropped: they are timestamps, not values)."""
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                out.setdefault(sample.name, []).append(sample)
    return out


def sample_sum(parsed: dict[str, list], name: str) -> float | None:
    """A sample summed over its label sets (e.g. `vllm:request_success_total` over finish reasons);
    None when the server does not export it."""
    found = parsed.get(name)
    return sum(s.value for s in found) if found else None


def sample_mean(parsed: dict[str, list], name: str) -> float | None:
    """A gauge averaged over its label sets (e.g. KV cache usage over engines)."""
    found = parsed.get(name)
    return sum(s.value for s in found) / len(found) if found else None


def histogram_buckets(parsed: dict[str, list], name: str) -> dict[float, float] | None:
    """A histogram's cumulative bucket counts {upper bound: count} summed over label sets (engines),
    e.g. name='vllm:inter_token_latency_seconds'; None when the server does not export it."""
    found = parsed.get(f"{name}_bucket")
    if not found:
        return None
    buckets: dict[float, float] = {}
    for s in found:
        bound = float(s.labels["le"])  # "+Inf" -> inf
        buckets[bound] = buckets.get(bound, 0.0) + s.value
    return buckets


def histogram_delta(
    before: dict[float, float] | None, after: dict[float, float] | None
) -> dict[float, float] | None:
    """Observations between two scrapes, bucket by bucket (`before` None: since the start)."""
    if after is None:
        return None
    before = before or {}
    return {bound: count - before.get(bound, 0.0) for bound, count in after.items()}


def histogram_quantile(q: float, buckets: dict[float, float] | None) -> float | None:
    """The q-quantile of cumulative buckets, interpolated linearly inside the bucket that holds it:
    the same estimate as PromQL's histogram_quantile(). None without observations; the largest
    finite bound when the quantile falls in the +Inf bucket."""
    if not buckets:
        return None
    ordered = sorted(buckets.items())
    total = ordered[-1][1]
    if total <= 0 or ordered[-1][0] != float("inf"):
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for index, (bound, count) in enumerate(ordered):
        if count >= rank:
            if bound == float("inf"):
                return ordered[index - 1][0] if index else None
            if index == 0 and bound <= 0:
                return bound
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return None


# vLLM 0.32.0's names (vllm/v1/metrics/loggers.py). A rename in a later release shows up as a
# `None` figure here and as a failing query in tests/integration/test_status_prometheus.py.
TPOT_HISTOGRAM = "vllm:request_time_per_output_token_seconds"
ITL_HISTOGRAM = "vllm:inter_token_latency_seconds"
TTFT_HISTOGRAM = "vllm:time_to_first_token_seconds"
REQUESTS_FINISHED = "vllm:request_success_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"


def live_figures(before_text: str | None, after_text: str, seconds: float | None) -> dict:
    """Figures between two scrapes `seconds` apart (`before_text` None: since the server started,
    rates then left out): request and token rates, acceptance rate and mean acceptance length,
    per-position acceptance (accepted at position i / drafts), TTFT/TPOT/ITL medians from the
    histograms' bucket deltas; running/waiting requests and KV cache usage (0-1) at the second
    scrape."""
    after = samples(after_text)
    before = samples(before_text) if before_text is not None else {}
    spec_after = spec_decode_counters(after_text)
    spec_before = spec_decode_counters(before_text) if before_text is not None else {}
    accept = acceptance(spec_before, spec_after)
    drafts = accept["drafts"]
    positions = sorted(
        int(key[len("num_accepted_tokens_per_pos[") : -1])
        for key in spec_after
        if key.startswith("num_accepted_tokens_per_pos[")
    )
    per_position = [
        (
            spec_after[f"num_accepted_tokens_per_pos[{p}]"]
            - spec_before.get(f"num_accepted_tokens_per_pos[{p}]", 0.0)
        )
        / drafts
        if drafts
        else None
        for p in positions
    ]

    def delta(name: str) -> float | None:
        now = sample_sum(after, name)
        return None if now is None else now - (sample_sum(before, name) or 0.0)

    def rate(name: str) -> float | None:
        change = delta(name)
        return change / seconds if change is not None and seconds else None

    def median(name: str) -> float | None:
        return histogram_quantile(
            0.5, histogram_delta(histogram_buckets(before, name), histogram_buckets(after, name))
        )

    def mean(name: str) -> float | None:  # exact, from _sum/_count (buckets can be coarse)
        count, total = delta(f"{name}_count"), delta(f"{name}_sum")
        return total / count if count and total is not None else None

    return {
        "seconds": seconds,
        "requests_finished": delta(REQUESTS_FINISHED),
        "request_rate": rate(REQUESTS_FINISHED) if before_text is not None else None,
        "generation_tokens_per_s": rate(GENERATION_TOKENS) if before_text is not None else None,
        "speculative": bool(spec_after),
        **accept,
        "per_position_acceptance": per_position,
        "ttft_median_s": median(TTFT_HISTOGRAM),
        "tpot_median_s": median(TPOT_HISTOGRAM),
        "itl_median_s": median(ITL_HISTOGRAM),
        "tpot_mean_s": mean(TPOT_HISTOGRAM),
        "itl_mean_s": mean(ITL_HISTOGRAM),
        "requests_running": sample_sum(after, "vllm:num_requests_running"),
        "requests_waiting": sample_sum(after, "vllm:num_requests_waiting"),
        "kv_cache_usage": sample_mean(after, KV_CACHE_USAGE),
    }


def per_position_acceptance(
    before: dict[str, float], after: dict[str, float]
) -> list[float] | None:
    """Per draft position i (0-based), the share of drafts whose i-th token was accepted, between
    two counter snapshots: Δ num_accepted_tokens_per_pos{position=i} / Δ num_drafts (the same
    definition as `vllm bench serve`'s spec_decode_per_position_acceptance_rates). A token is
    accepted only after every earlier one, so the curve can only fall; None without drafts."""
    drafts = after.get("num_drafts", 0) - before.get("num_drafts", 0)
    key = "num_accepted_tokens_per_pos"
    positions = sorted(
        int(name[len(key) + 1 : -1])
        for name in set(before) | set(after)
        if name.startswith(f"{key}[")
    )
    if not drafts or not positions:
        return None
    return [
        (after.get(f"{key}[{i}]", 0) - before.get(f"{key}[{i}]", 0)) / drafts for i in positions
    ]


def pooled_per_position_acceptance(counter_deltas: list[dict]) -> list[float] | None:
    """Per-position acceptance pooled over several runs' counter deltas (each as returned by
    `acceptance()` with a "per_position" list): Σ accepted at i / Σ drafts."""
    runs = [c for c in counter_deltas if c.get("per_position") and c.get("drafts")]
    if not runs:
        return None
    drafts = sum(c["drafts"] for c in runs)
    k = max(len(c["per_position"]) for c in runs)
    return [
        sum(c["per_position"][i] * c["drafts"] for c in runs if i < len(c["per_position"])) / drafts
        for i in range(k)
    ]
