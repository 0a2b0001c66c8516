"""Bench results for the draft choice's fast-tier tests: the shape `vllm bench serve` writes with
specdeploy's part, from a step-time model of the H200 pair (benchmarks/gpu_payoff: the first draft
token costs ~0.4 of a target step for a 0.6B draft, every further one less) and per-position
acceptance of the kind the sandbox's trained draft reports. The noise is seeded, so every test
replays the same runs."""

from __future__ import annotations

import random

BASE_STEP_MS = 20.0

# name -> (cost of turning speculation on, cost per further draft token), shares of a target step
COSTS = {
    "trained": (0.35, 0.08),
    "bigger": (0.55, 0.20),
    "poor": (0.25, 0.05),
    "ngram": (0.05, 0.005),
}

# per-position acceptance on two request sets: code (repetitive, where prompt lookup shines) and
# chat (little to look up); a_i falls with the position i as accepted drafts form a prefix
ACCEPTANCE = {
    "code": {
        "trained": [0.80, 0.66, 0.55, 0.45, 0.37],
        "bigger": [0.86, 0.75, 0.65, 0.56, 0.48],
        "poor": [0.10, 0.02, 0.0, 0.0, 0.0],
        "ngram": [0.90, 0.85, 0.80, 0.76, 0.72],
    },
    "chat": {
        "trained": [0.70, 0.52, 0.40, 0.30, 0.22],
        "bigger": [0.84, 0.70, 0.58, 0.47, 0.38],
        "poor": [0.08, 0.01, 0.0, 0.0, 0.0],
        "ngram": [0.12, 0.05, 0.02, 0.01, 0.0],
    },
}


def true_tpot(name: str, request_set: str, k: int) -> float:
    if k == 0:
        return BASE_STEP_MS
    first, each = COSTS[name]
    step = BASE_STEP_MS * (1 + first + each * (k - 1))
    return step / (1 + sum(ACCEPTANCE[request_set][name][:k]))


def bench(label: str, index: int, tpot: float, k: int, rates: list[float] | None) -> dict:
    spec = k > 0
    out = {
        "median_tpot_ms": tpot,
        "median_ttft_ms": 30.0,
        "completed": 64,
        "specdeploy": {
            "arm": label,
            "index": index,
            "warmup": False,
            "speculative": spec,
            "prefix_caching": False,
            "fresh_server": True,
            "speculative_config": {"num_speculative_tokens": k} if spec else None,
        },
    }
    if spec:
        out |= {
            "spec_decode_per_position_acceptance_rates": rates[:k],
            "spec_decode_acceptance_length": 1 + sum(rates[:k]),
            "spec_decode_num_drafts": 2000,
        }
    return out


def pin_runs(names: list[str], request_set: str, k_max: int = 5, seed: int = 1) -> list[dict]:
    """The pin phase: one baseline run and one run per candidate at k_max."""
    rng = random.Random(seed)
    out = [bench("p-baseline", 0, BASE_STEP_MS * rng.uniform(0.98, 1.02), 0, None)]
    for i, name in enumerate(names):
        tpot = true_tpot(name, request_set, k_max) * rng.uniform(0.98, 1.02)
        rates = ACCEPTANCE[request_set][name]
        out.append(bench(f"p-d{i}-k{k_max}", len(out), tpot, k_max, rates))
    return out


def proving_runs(
    arms: dict[str, tuple[str, int]], request_set: str, rounds: int, start: int, seed: int = 2
) -> list[dict]:
    """`rounds` rounds over {label: (candidate name, k)} and the baseline, fresh servers, 3 %
    noise."""
    rng = random.Random(seed)
    out = []
    labels = ["baseline", *arms]
    for r in range(rounds):
        shift = r % len(labels)
        for label in labels[shift:] + labels[:shift]:
            if label == "baseline":
                name, k, rates = "", 0, None
                tpot = BASE_STEP_MS
            else:
                name, k = arms[label]
                rates = ACCEPTANCE[request_set][name]
                tpot = true_tpot(name, request_set, k)
            out.append(bench(label, start + len(out), tpot * rng.gauss(1, 0.03), k, rates))
    return out
