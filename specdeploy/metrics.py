"""Read vLLM's Prometheus /metrics text (parsed by prometheus_client, not by hand)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

PREFIX = "vllm:spec_decode_"


def spec_decode_counters(text: str) -> dict[str, float]:
    """{'num_drafts': ..., 'num_draft_tokens': ..., 'num_accepted_tokens': ...} summed over label sets
    (per-position counters are kept as 'num_accepted_tokens_per_pos[i]')."""
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
