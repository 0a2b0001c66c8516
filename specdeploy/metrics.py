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
