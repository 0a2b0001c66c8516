"""Load-aware speculation (issue 39): the choice of k at every load level, the per-batch-size
schedule built from those choices, vLLM's own rules for that schedule, and the proof that a
schedule wins at every level. Pure functions: no host, no I/O.

Speculation pays at a small batch, where the target's step is bound by latency and the draft's
tokens ride along, and can lose as the batch fills and every rejected draft token is paid for (H200,
vLLM 0.26: k = 1 0.94x the baseline's TPOT at concurrency 1, 1.40x at 16, 1.52x at 64). A schedule
is not safe by itself either: the same sweep's schedule ran slower than every fixed arm at every
level (shared/gpu/load-sweep-2026-12-04). So a schedule is only ever a candidate until it has been
measured winning (`recommend`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from specdeploy.config.record import BenchResult, bench_result
from specdeploy.decide.choose import choose_k
from specdeploy.decide.decisions import BETTER, WORSE, compare_values, run_values
from specdeploy.decide.stats import DEFAULT_ALPHA, median, min_runs_per_arm, rank_test

SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"  # vLLM's (vllm#32374), from 0.26.0

LOAD_RULE = (
    "at each of the L load levels, choose_k's rule over that level's runs at alpha / L "
    "(Bonferroni over the levels; within a level Holm over the k against the baseline): the "
    "chance of any false 'faster' at any level is <= alpha by the union bound. A k is "
    "'significantly slower than the baseline' at a level when the one-sided rank test gives "
    "p <= alpha / (L x K). A batch size between two measured levels takes the higher level's k "
    "(speculation pays less as the batch fills, so that choice is the safer one); sizes above the "
    "highest level keep its k but are outside the proven range"
)
PROOF_RULE = (
    "at each of the L levels, the exact two-sided rank test of the schedule's runs against the "
    "baseline's and against the best fixed k's at alpha / L (Bonferroni over the levels). A "
    "schedule is proven when it is significantly faster than the baseline at one level at least, "
    "significantly slower than the baseline at none and significantly slower than the fixed k at "
    "none; else the fixed k under the same test, else leave speculation off"
)


# --- the runs: labels `<arm>@c<concurrency>` (measure/load_flow.py) ------------------------------

_LABEL = re.compile(r"^(?P<arm>.+)@c(?P<concurrency>[0-9]+)$")


def level_label(arm: str, concurrency: int) -> str:
    return f"{arm}@c{concurrency}"


def split_label(label: str) -> tuple[str, int] | None:
    """("k3", 4) from "k3@c4"; None for a label of no level (warm-up runs keep theirs too)."""
    m = _LABEL.match(label)
    return (m["arm"], int(m["concurrency"])) if m else None


def tpot_by_level(results: Sequence[BenchResult | Mapping]) -> dict[int, dict[str, list[float]]]:
    """{concurrency: {arm: run-level TPOTs}} of the counted runs, in index order."""
    out: dict[int, dict[str, list]] = {}
    for r in map(bench_result, results):
        parts = split_label(r.run.arm) if r.run and not r.run.warmup else None
        if parts:
            arm, c = parts
            out.setdefault(c, {}).setdefault(arm, []).append(r)
    return {c: {arm: run_values(rs, "tpot") for arm, rs in arms.items()} for c, arms in out.items()}


def rotating_rounds(arms: Sequence[str], repeats: int) -> list[str]:
    """`repeats` rounds over `arms`, each round starting one arm later (no arm always first):
    the order of the visits of compare_across_load, tune_method = load and the gate across load."""
    n = len(arms)
    return [arms[(r + i) % n] for r in range(repeats) for i in range(n)]


def k_of(arm: str) -> int | None:
    """0 for the baseline, k for "k<k>", None for any other arm."""
    if arm == "baseline":
        return 0
    return int(arm[1:]) if re.fullmatch(r"k[0-9]+", arm) else None


def level_alpha(alpha: float, levels: int) -> float:
    """Each level's share of the family's alpha (Bonferroni over the levels)."""
    return alpha / max(levels, 1)


def proof_runs(levels: int, alpha: float = DEFAULT_ALPHA) -> int:
    """The fewest runs per arm at which the proof's two-sided test at alpha / L can decide
    (PROOF_RULE): 5 over three levels at 0.05 (2/252), 4 at 0.1 (2/70)."""
    return min_runs_per_arm(level_alpha(alpha, levels))


# --- vLLM's rules for the schedule ----------------------------------------------------------------


def is_int(value: object) -> bool:
    """An int that is not a bool (JSON host data: True is not a batch size or a k)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _no_overlap(schedule: list) -> bool:
    ends = 0
    for start, end, _ in sorted(schedule):
        if start <= ends:
            return False
        ends = end
    return True


# The one home of a schedule's form: each rule of vLLM's validator (v1/spec_decode/dynamic/utils.py
# validate_and_normalize_dynamic_sd_schedule), named as a release table's `refused_unless` names it
# (releases/probe.SCHEDULE_RULES), in the validator's order, each assuming the ones before it
# hold, with the sentence a user reads when it breaks.
SCHEDULE_FORM = {
    "a list of entries": (
        lambda s: isinstance(s, list),
        "must be a non-empty list of [start_batch_size, end_batch_size, k]",
    ),
    "not empty": (
        lambda s: bool(s),
        "must be a non-empty list of [start_batch_size, end_batch_size, k]",
    ),
    "entries are [start, end, k]": (
        lambda s: all(
            isinstance(e, list | tuple) and len(e) == 3 and all(is_int(x) for x in e) for e in s
        ),
        "every entry must be three integers [start, end, k]",
    ),
    "start >= 1 and end >= 1": (
        lambda s: all(e[0] >= 1 and e[1] >= 1 for e in s),
        "every range must be 1 <= start <= end: batch sizes start at 1",
    ),
    "start <= end": (
        lambda s: all(e[0] <= e[1] for e in s),
        "every range must be 1 <= start <= end: a range ends before it starts",
    ),
    "k >= 0": (
        lambda s: all(e[2] >= 0 for e in s),
        "every k must be >= 0 (0: speculation off)",
    ),
    "ranges do not overlap": (_no_overlap, "ranges must be sorted and non-overlapping"),
    "the first range starts at 1": (
        lambda s: min(e[0] for e in s) == 1,
        "the first range must start at batch size 1",
    ),
}


def broken_schedule_rule(schedule: object, rules: Sequence[str] | None = None) -> str | None:
    """The first of `rules` (a release table's `refused_unless`; None: every rule of
    SCHEDULE_FORM, which is vLLM 0.32.0's validator) that `schedule` breaks, or None."""
    return next(
        (rule for rule in rules or SCHEDULE_FORM if not SCHEDULE_FORM[rule][0](schedule)), None
    )


def schedule_problems(schedule: object, num_speculative_tokens: int | None) -> list[str]:
    """What vLLM refuses or silently changes in a schedule, as sentences: the first rule of
    SCHEDULE_FORM it breaks; and, since vLLM clamps a k above num_speculative_tokens to it without
    a word (build_dynamic_sd_schedule_lookup), such a k, since the schedule
    would not run as written."""
    broken = broken_schedule_rule(schedule)
    if broken:
        return [f"{schedule!r}: {SCHEDULE_FORM[broken][1]}"]
    return [
        f"entry {i} {list(entry)}: k {entry[2]} is above num_speculative_tokens "
        f"{num_speculative_tokens} (vLLM would clamp it silently)"
        for i, entry in enumerate(schedule)
        if num_speculative_tokens is not None and entry[2] > num_speculative_tokens
    ]


def k_at(schedule: Sequence[Sequence[int]], batch_size: int, num_speculative_tokens: int) -> int:
    """The k vLLM runs at `batch_size` under a valid schedule: the range holding it, a gap carries
    the previous range's k, the tail the last one's, each capped at num_speculative_tokens
    (build_dynamic_sd_schedule_lookup)."""
    k = 0
    for start, end, range_k in sorted(schedule):
        if start > batch_size:
            break
        k = range_k
        if batch_size <= end:
            break
    return min(k, num_speculative_tokens)


# --- the choice at every level, and the schedule it calls for -------------------------------------


def decide_levels(
    runs: Mapping[int, Mapping[int, Sequence[float]]], *, alpha: float = DEFAULT_ALPHA
) -> dict:
    """runs: {concurrency: {k: run-level TPOTs}}, k = 0 the baseline. Returns {alpha, level_alpha,
    rule, levels {concurrency: choose_k's result at level_alpha, plus slower_than_baseline {k:
    bool}}, best_k {concurrency: the recommended k, 0 where off}}."""
    levels = sorted(runs)
    if not levels:
        raise ValueError("no load level was measured")
    each = level_alpha(alpha, len(levels))
    out: dict = {"alpha": alpha, "level_alpha": each, "rule": LOAD_RULE, "levels": {}}
    for c in levels:
        by_k = {k: list(v) for k, v in runs[c].items() if v}
        if 0 not in by_k:
            raise ValueError(f"concurrency {c}: no baseline runs")
        choice = choose_k(by_k, alpha=each)
        ks = sorted(choice["per_k"])
        slower = {
            k: rank_test(by_k[k], by_k[0], alternative="greater")["p_value"] <= each / len(ks)
            for k in ks
        }
        out["levels"][c] = {**choice, "slower_than_baseline": slower}
    out["best_k"] = {c: out["levels"][c]["recommended_k"] or 0 for c in levels}
    return out


def build_schedule(best_k: Mapping[int, int], *, max_num_seqs: int) -> list[list[int]] | None:
    """The schedule for {concurrency: k (0: off)}: level i governs batch sizes above level i-1 up
    to its own concurrency (the first from 1), the highest level also the sizes above it up to
    max_num_seqs; neighbouring ranges with the same k are merged. None when one k (or off) holds
    at every level: then no schedule is needed."""
    levels = sorted(best_k)
    if len({best_k[c] for c in levels}) <= 1:
        return None
    schedule: list[list[int]] = []
    start = 1
    for i, c in enumerate(levels):
        end = max(c, max_num_seqs) if i == len(levels) - 1 else c
        k = best_k[c]
        if schedule and schedule[-1][2] == k:
            schedule[-1][1] = end
        else:
            schedule.append([start, end, k])
        start = end + 1
    return schedule


def fixed_k_over_levels(decision: Mapping) -> dict:
    """The best single k over the load range: significantly faster than the baseline at one level
    at least and significantly slower at none; among those, faster at the most levels, then the
    smallest. Returns {k (None: off), faster_at, loses_at {k: [levels where it is significantly
    slower]}, pays_at {k: [levels where it is faster]}, verdict}."""
    levels = decision["levels"]
    ks = sorted({k for lv in levels.values() for k in lv["per_k"]})
    pays = {k: [c for c, lv in levels.items() if lv["per_k"].get(k, {}).get("faster_than_baseline")]
            for k in ks}  # fmt: skip
    loses = {k: [c for c, lv in levels.items() if lv["slower_than_baseline"].get(k)] for k in ks}
    safe = [k for k in ks if pays[k] and not loses[k]]
    out = {"pays_at": pays, "loses_at": loses}
    if safe:
        k = min(safe, key=lambda k: (-len(pays[k]), k))
        return out | {
            "k": k,
            "faster_at": pays[k],
            "verdict": f"k = {k}: faster than the baseline at concurrency "
            f"{_levels(pays[k])}, not significantly slower at any level",
        }
    losing = [f"k = {k} pays at {_levels(pays[k])} but loses at {_levels(loses[k])}"
              for k in ks if pays[k]]  # fmt: skip
    why = "; ".join(losing) if losing else "no k is faster than the baseline at any level"
    return out | {"k": None, "faster_at": [], "verdict": f"leave speculation off: {why}"}


def _levels(levels: Sequence[int]) -> str:
    return ", ".join(str(c) for c in levels) if levels else "none"


def tune_recommendation(
    decision: Mapping,
    *,
    max_num_seqs: int,
    schedule_supported: bool,
    data_parallel_size: int = 1,
) -> dict:
    """What a load-aware tune recommends before any proof: {schedule (the candidate, or None),
    schedule_needed (the schedule the levels call for, candidate or not), candidate_why (why it is
    no candidate), fixed (fixed_k_over_levels), recommended ("schedule candidate", "k", "off"),
    verdict}. A schedule is only a candidate: compare_across_load must measure it winning
    (`recommend`) before it is deployed; until then the fixed k (or off) is what to run."""
    fixed = fixed_k_over_levels(decision)
    schedule = build_schedule(decision["best_k"], max_num_seqs=max_num_seqs)
    why = None
    if schedule is None:
        why = "one choice holds at every level: no schedule needed"
    elif not schedule_supported:
        why = f"this release has no {SCHEDULE_KEY}"
    elif data_parallel_size > 1:
        why = f"vLLM drops {SCHEDULE_KEY} silently with data parallelism > 1"
    candidate = schedule if why is None else None
    tail = fixed["verdict"]
    verdict = (
        f"candidate schedule {candidate} (to be proven at every level by compare_across_load "
        f"before it is deployed); until then: {tail}"
        if candidate
        else f"{tail} ({why})"
        if schedule
        else tail
    )
    return {
        "schedule": candidate,
        "schedule_needed": schedule,
        "candidate_why": why,
        "fixed": fixed,
        "recommended": "schedule candidate" if candidate else ("k" if fixed["k"] else "off"),
        "verdict": verdict,
    }


def schedule_config(
    speculative_config: Mapping, schedule: Sequence[Sequence[int]] | None, k: int | None = None
) -> dict:
    """speculative_config running `schedule` (num_speculative_tokens = its largest k, so vLLM caps
    nothing), or fixed k (schedule None) without any schedule."""
    out = {key: v for key, v in speculative_config.items() if key != SCHEDULE_KEY}
    if schedule:
        out |= {"num_speculative_tokens": max(e[2] for e in schedule),
                SCHEDULE_KEY: [list(e) for e in schedule]}  # fmt: skip
    elif k:
        out["num_speculative_tokens"] = k
    return out


# --- the proof: the schedule against the baseline and the best fixed k at every level -----------


def prove_schedule(
    runs: Mapping[int, Mapping[str, Sequence[float]]],
    *,
    alpha: float = DEFAULT_ALPHA,
    subject: str = "the schedule",
) -> dict:
    """runs: {concurrency: {"baseline": TPOTs, "schedule": TPOTs, "fixed": TPOTs}} (fixed: the best
    fixed k, optional). Returns {alpha, level_alpha, rule, levels {c: {vs_baseline, vs_fixed
    (compare_values at level_alpha; lower TPOT is better)}}, proven, fixed_proven, slower_at
    (levels where the schedule is significantly slower than the baseline), behind_fixed_at,
    faster_at, fixed_faster_at, fixed_slower_at (the fixed k against the baseline), decision
    ("schedule", "fixed", "off"), verdict}. `subject` names the "schedule" arm in the verdict: a
    plain speculative config (no schedule, e.g. where the release refuses the key) is a "k = 3"."""
    levels = sorted(runs)
    each = level_alpha(alpha, len(levels))
    per: dict[int, dict] = {}
    for c in levels:
        arms = runs[c]
        per[c] = {
            "vs_baseline": compare_values(arms["schedule"], arms["baseline"], alpha=each),
            "vs_fixed": compare_values(arms["schedule"], arms["fixed"], alpha=each)
            if arms.get("fixed")
            else None,
            "fixed_vs_baseline": compare_values(arms["fixed"], arms["baseline"], alpha=each)
            if arms.get("fixed")
            else None,
        }

    def where(key: str, verdict: str) -> list[int]:
        return [c for c in levels if per[c][key] and per[c][key]["verdict"] == verdict]

    slower, faster = where("vs_baseline", WORSE), where("vs_baseline", BETTER)
    behind = where("vs_fixed", WORSE)
    fixed_slower, fixed_faster = (
        where("fixed_vs_baseline", WORSE),
        where("fixed_vs_baseline", BETTER),
    )
    proven = bool(faster) and not slower and not behind
    fixed_proven = bool(fixed_faster) and not fixed_slower
    if proven:
        decision = "schedule"
        verdict = (
            f"{subject} is never significantly slower than the baseline or the fixed k at any "
            f"level and faster than the baseline at concurrency {_levels(faster)}"
        )
    else:
        lost = (
            f"significantly slower than the baseline at concurrency {_levels(slower)}"
            if slower
            else f"significantly slower than the fixed k at concurrency {_levels(behind)}"
            if behind
            else "not shown faster than the baseline at any level"
        )
        decision = "fixed" if fixed_proven else "off"
        then = (
            f"the fixed k instead (faster at {_levels(fixed_faster)}, slower at none)"
            if fixed_proven
            else "leave speculation off"
            + (f" (the fixed k loses at {_levels(fixed_slower)})" if fixed_slower else "")
        )
        verdict = f"{subject} is not deployed: {lost}; {then}"
    return {
        "alpha": alpha,
        "level_alpha": each,
        "rule": PROOF_RULE,
        "levels": per,
        "proven": proven,
        "fixed_proven": fixed_proven,
        "slower_at": slower,
        "behind_fixed_at": behind,
        "faster_at": faster,
        "fixed_faster_at": fixed_faster,
        "fixed_slower_at": fixed_slower,
        "decision": decision,
        "verdict": verdict,
    }


def proven_range(levels: Sequence[int]) -> tuple[int, int]:
    """The batch sizes a proof covers: 1 up to the highest concurrency measured."""
    return (1, max(levels))


def proof_range(proof: Mapping | None) -> tuple[int, int] | None:
    """The batch sizes a proof (a kept one, or a record's schedule_proof) proves its schedule over:
    1 up to its highest level. None where it proves nothing: no proof, one that did not prove the
    schedule, an allowance (allow_unproven_schedule), or a proof matched on host and schedule
    alone (recorded before proofs carried their fingerprint's key)."""
    if not proof or not proof.get("proven") or not proof.get("key") or not proof.get("levels"):
        return None
    return proven_range([int(c) for c in proof["levels"]])


def schedule_standing(speculative_config: Mapping, proof: Mapping | None) -> str | None:
    """What status says of a deployed schedule's evidence: None without a schedule, "schedule
    proven at batch sizes 1-N (run R on H)" or "schedule unproven (why)"."""
    if SCHEDULE_KEY not in speculative_config:
        return None
    top = proof_range(proof)
    if top is not None:
        return (f"schedule proven at batch sizes {top[0]}-{top[1]} (run {proof.get('run')} on "
                f"{proof.get('measured_on')})")  # fmt: skip
    if proof and proof.get("allowed_unproven"):
        why = f"deployed under allow_unproven_schedule: {proof.get('why')}"
    elif proof and proof.get("proven"):
        why = "its proof was matched on the host and the schedule alone, not its fingerprint"
    elif proof:
        why = f"its proof did not prove it: {proof.get('verdict')}"
    else:
        why = "the record holds no proof"
    return f"schedule unproven ({why})"


def batch_outside_proven(proven: tuple[int, int] | None, running: float | None) -> str | None:
    """A sentence when the running batch is larger than any the schedule was proven at."""
    if proven is None or running is None or running <= proven[1]:
        return None
    return (
        f"running batch {running:g} is outside the schedule's proven range {proven[0]}-"
        f"{proven[1]} (its proof's load levels): add the level and prove it (compare_across_load)"
    )


def ratio_by_level(
    runs: Mapping[int, Mapping[str, Sequence[float]]], arm: str, *, alpha: float
) -> dict[int, dict]:
    """{concurrency: {ratio, low, high}}: `arm`'s TPOT over the baseline's at every level, with the
    rank-test interval at level_alpha (for the report's plot)."""
    each = level_alpha(alpha, len(runs))
    out = {}
    for c, arms in sorted(runs.items()):
        if arms.get(arm) and arms.get("baseline"):
            r = compare_values(arms[arm], arms["baseline"], alpha=each)
            out[c] = {"ratio": r["ratio"], "low": r["low"], "high": r["high"],
                      "median": median(arms[arm])}  # fmt: skip
    return out


# --- the threshold-crossing collapse (vllm#49548): a load ramp across a schedule boundary --------

CROSSING_RULE = (
    "at each ramp level, the schedule's run-level output throughput against each neighbouring "
    "fixed config's (the k of the range below the boundary, the k above; k = 0 is the baseline) "
    "by the exact two-sided rank test at alpha / L: a collapse is a level where the schedule is "
    "significantly below both neighbours, i.e. worse than either config it switches between"
)


def schedule_boundaries(schedule: Sequence[Sequence[int]]) -> list[dict]:
    """Where a valid schedule's k changes: [{at (the last batch size running the lower range's k:
    a gap carries it, as k_at does), below (its k), above (the next range's k)}], in order;
    neighbouring ranges with the same k are no boundary."""
    return [
        {"at": start - 1, "below": k, "above": next_k}
        for (_, _, k), (start, _, next_k) in zip(schedule, schedule[1:], strict=False)
        if k != next_k
    ]


def ramp_levels(boundary: int, *, width: int, max_num_seqs: int) -> list[int]:
    """The concurrencies of a ramp across the boundary after batch size `boundary`: `width` sizes
    up to it and `width` above it, within 1..max_num_seqs, lowest first (the order a visit runs
    them on one server: the load crosses the threshold while the server runs)."""
    return [c for c in range(boundary - width + 1, boundary + width + 1) if 1 <= c <= max_num_seqs]


def crossing_verdict(
    runs: Mapping[int, Mapping[str, Sequence[float]]],
    *,
    boundary: int,
    alpha: float = DEFAULT_ALPHA,
) -> dict:
    """runs: {concurrency: {"schedule", "below", "above": run-level output throughputs (tokens/s,
    higher is better)}}; `boundary`: the last batch size the lower range governs. Returns {rule,
    level_alpha, levels {c: {runs_as ("below" or "above": the config the schedule runs there),
    vs_below, vs_above (compare_values, higher is better)}}, collapsed_at (levels where the
    schedule is significantly below both neighbours), behind_own_at (below the config it runs
    there), verdict}."""
    levels = sorted(runs)
    if not levels:
        raise ValueError("no ramp level was measured")
    each = level_alpha(alpha, len(levels))
    per: dict[int, dict] = {}
    for c in levels:
        arms = runs[c]
        missing = {"schedule", "below", "above"} - {a for a, v in arms.items() if v}
        if missing:
            raise ValueError(f"concurrency {c}: no {', '.join(sorted(missing))} runs")
        per[c] = {
            "runs_as": "below" if c <= boundary else "above",
            **{
                f"vs_{side}": compare_values(
                    arms["schedule"], arms[side], lower_is_better=False, alpha=each
                )
                for side in ("below", "above")
            },
        }
    collapsed = [c for c in levels if all(per[c][f"vs_{s}"]["verdict"] == WORSE
                                          for s in ("below", "above"))]  # fmt: skip
    behind = [c for c in levels if per[c][f"vs_{per[c]['runs_as']}"]["verdict"] == WORSE]
    if collapsed:
        verdict = (
            f"collapse: the schedule's throughput is significantly below both neighbouring fixed "
            f"configs at concurrency {_levels(collapsed)} (boundary after batch size {boundary})"
        )
    elif behind:
        verdict = (
            f"no collapse, but the schedule is below the config it runs at concurrency "
            f"{_levels(behind)} (boundary after batch size {boundary})"
        )
    else:
        verdict = (
            f"no collapse across the boundary after batch size {boundary}: the schedule is not "
            f"significantly below the config it runs at any ramp level"
        )
    return {
        "rule": CROSSING_RULE,
        "alpha": alpha,
        "level_alpha": each,
        "boundary": boundary,
        "levels": per,
        "collapsed_at": collapsed,
        "behind_own_at": behind,
        "verdict": verdict,
    }
