"""Which draft, at which k: the pure rules of deploys/choose_draft.py (measure/draft_flow.py runs
the servers). Pure functions over bench results: no host, no I/O, so a recorded run replays.

Cheap first, then proven:

1. **pin**: one fresh-server run of the baseline and one of each candidate at k_max (the largest
   tune_k) on the user's request set. Each candidate's run gives its per-position acceptance;
   predict.predict() over the baseline run and that run gives the candidate's TPOT curve over
   tune_k (with one speculative k the step model is predict's "linear" one, which assumes every
   draft token costs the same: the prediction only picks what to prove).
2. **prove**: the best k of the two candidates predicted fastest (one pair per candidate, so two
   drafts are compared, not two k of one draft) and the baseline, in rotating rounds of fresh
   servers, looked at by the project's sequential rule (stats.sequential_looks, one-sided); each
   pair against the baseline at alpha / pairs (Bonferroni: a false "faster" over both pairs and
   every look stays <= alpha).
3. **decide**: the pair shown faster than the baseline with the lowest median TPOT; none: "off".

Labels: the pin runs are `p-baseline` and `p-d<i>-k<k>`, the proving runs `baseline` and
`d<i>-k<k>` (i: the candidate's place in draft_candidates), so the proof counts only its own runs.

At load levels (the workload's load_levels, the load proof's visits: a fresh server per arm, one run
per level, labels `<arm>@c<concurrency>`): each level is pinned, predicted, paired and proven as
above on its own runs, at alpha / levels (Bonferroni over the levels, as the load proof spends it);
each level has its verdict, and the recommendation is the pair shown faster than the baseline at
every level (the lowest worst-level TPOT ratio), else "off" with each level's verdict.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from specdeploy.config.record import BenchResult
from specdeploy.decide.decisions import _clean, run_values, summarize_values
from specdeploy.decide.load_rule import level_alpha, split_label
from specdeploy.decide.predict import best_k, json_rows, predict, run_from_bench
from specdeploy.decide.stats import DEFAULT_ALPHA, median, rank_test, sequential_looks
from specdeploy.decide.tune_rule import counted, runs_by_label

PIN_BASELINE = "p-baseline"
BASELINE = "baseline"
PAIRS = 2  # candidate/k pairs proven against the baseline
OFF = "off"
DRAFT_RULE = (
    "each proven candidate/k pair against the baseline: exact one-sided permutation test on ranks "
    "of run-level TPOT (one value per fresh server start) at alpha / pairs (Bonferroni over the "
    "pairs), at the sequential rule's looks (stats.SEQUENTIAL_RULE, one-sided); recommended: the "
    "pair shown faster with the lowest median TPOT, else speculation off"
)
_LABEL = re.compile(r"^(p-)?d(\d+)-k(\d+)$")


def arm_label(index: int, k: int, *, pin: bool = False) -> str:
    return f"{'p-' if pin else ''}d{index}-k{k}"


def parse_label(label: str) -> tuple[bool, int, int] | None:
    """(pin, candidate index, k) of a candidate arm's label; None for the baseline arms."""
    m = _LABEL.match(label)
    return (bool(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


# --- cheap first: per-position acceptance and the predicted curves --------------------------------


def curves(results: Sequence[BenchResult | Mapping], ks: Sequence[int]) -> dict[int, dict]:
    """{candidate index: its pin evidence}: per-position acceptance, acceptance length, the
    predicted rows over tune_k (predict.json_rows), its predicted best k and TPOT there. A
    candidate whose pin run reports no acceptance has `best_k` None."""
    by_label = runs_by_label(results)
    base = [r for r in map(run_from_bench, by_label.get(PIN_BASELINE, [])) if r]
    out: dict[int, dict] = {}
    for label, rs in sorted(by_label.items()):
        parsed = parse_label(label)
        if not parsed or not parsed[0]:
            continue
        _, index, k_max = parsed
        spec = [r for r in map(run_from_bench, rs) if r]
        prediction = predict(base + spec, ks=[0, *sorted(set(ks))])
        rows = json_rows(prediction)
        top = best_k([r for r in prediction["rows"] if r["k"] in ks])
        tpot = next((r["tpot_ms"] for r in rows if r["k"] == top), None)
        out[index] = {
            "pinned_k": k_max,
            "per_position_acceptance": prediction["rates"],
            "acceptance_length": 1.0 + sum(prediction["rates"]),
            "pin_tpot_ms": spec[0].tpot_ms if spec else None,
            "step_model": prediction["model"],
            "rows": rows,
            "best_k": top,
            "predicted_tpot_ms": tpot,
        }
    return out


def best_pairs(evidence: Mapping[int, Mapping], *, pairs: int = PAIRS) -> list[tuple[int, int]]:
    """The (candidate, k) pairs to prove: each candidate's predicted best k, the `pairs`
    candidates predicted fastest there (ties: the earlier candidate)."""
    ranked = sorted(
        (e["predicted_tpot_ms"], i, e["best_k"])
        for i, e in evidence.items()
        if e.get("best_k") is not None and e.get("predicted_tpot_ms") is not None
    )
    return [(i, k) for _, i, k in ranked[:pairs]]


# --- then proven: the sequential comparison against the baseline ---------------------------------


def looks(max_runs: int, pairs: int, alpha: float) -> list[dict]:
    """The looks of the proof: one-sided, each pair at alpha / pairs."""
    return sequential_looks(max_runs, alpha=alpha / max(pairs, 1), alternative="less")


def tpot_by_label(results: Sequence[BenchResult | Mapping]) -> dict[str, list[float]]:
    """Run-level TPOT of every counted arm, by label."""
    return {label: run_values(rs, "tpot") for label, rs in runs_by_label(results).items()}


def _tests(tpot: Mapping[str, Sequence[float]], labels: Sequence[str]) -> dict[str, dict]:
    base = list(tpot.get(BASELINE, []))
    out = {}
    for label in labels:
        spec = list(tpot.get(label, []))
        if not spec or not base:
            out[label] = {"runs": len(spec), "p_faster": None, "p_slower": None, "ratio": None}
            continue
        out[label] = {
            "runs": len(spec),
            "p_faster": rank_test(spec, base, alternative="less")["p_value"],
            "p_slower": rank_test(spec, base, alternative="greater")["p_value"],
            "ratio": _clean(median(spec) / median(base)),
        }
    return out


def next_step(
    tpot: Mapping[str, Sequence[float]],
    labels: Sequence[str],
    *,
    max_runs: int,
    alpha: float = DEFAULT_ALPHA,
) -> dict:
    """ "decide now" or "add a round" from the proving runs so far ({label: run-level TPOTs}, the
    baseline under BASELINE). Decides at a look where some pair is shown faster than the baseline,
    or every pair slower, or at the budget's end."""
    rule_looks = looks(max_runs, len(labels), alpha)
    if not rule_looks:
        raise ValueError(f"{max_runs} runs per arm can never reach alpha {alpha:g} / {len(labels)}")
    counts = {len(tpot.get(a, [])) for a in [BASELINE, *labels]}
    if len(counts) != 1:
        return {"action": "add a round", "reason": "unequal arms: looks are at equal counts"}
    n = counts.pop()
    look = next((lk for lk in rule_looks if lk["runs"] == n), None)
    if look is None:
        return {"action": "add a round", "reason": f"{n} runs per arm: not a look"}
    tests = _tests(tpot, labels)
    faster = [a for a in labels if (tests[a]["p_faster"] or 1.0) <= look["level"]]
    slower = [a for a in labels if (tests[a]["p_slower"] or 1.0) <= look["level"]]
    level = look["level"]
    if faster or len(slower) == len(labels) or n >= max_runs:
        why = f"faster {faster or 'none'}, slower {slower or 'none'} at this look's level"
        return {"action": "decide now", "look": look, "tests": tests,
                "reason": f"{n} runs per arm: {why} {level:.3g}"}  # fmt: skip
    return {"action": "add a round", "look": look, "tests": tests,
            "reason": f"{n} runs per arm: undecided at level {level:.3g}"}  # fmt: skip


def decide(
    results: Sequence[BenchResult | Mapping],
    pairs: Sequence[tuple[int, int]],
    names: Sequence[str],
    *,
    max_runs: int,
    alpha: float = DEFAULT_ALPHA,
) -> dict:
    """The recommendation from the proving runs: the pair shown faster than the baseline at its
    look's level (alpha / pairs, spent over the looks) with the lowest median TPOT, or OFF."""
    return decide_tpot(tpot_by_label(results), pairs, names, max_runs=max_runs, alpha=alpha)


def decide_tpot(
    measured: Mapping[str, Sequence[float]],
    pairs: Sequence[tuple[int, int]],
    names: Sequence[str],
    *,
    max_runs: int,
    alpha: float = DEFAULT_ALPHA,
) -> dict:
    """decide() over the proving runs' run-level TPOTs by label; the decision keeps them
    (`tpot`), so a recorded decision replays from itself (replay())."""
    labels = [arm_label(i, k) for i, k in pairs]
    tpot = {a: list(measured.get(a, [])) for a in [BASELINE, *labels]}
    out = {"alpha": alpha, "rule": DRAFT_RULE, "pairs": [], "max_runs": max_runs,
           "baseline": summarize_values(tpot[BASELINE]), "tpot": tpot}  # fmt: skip
    if not labels:
        return {**out, "recommended": None, "verdict": f"{OFF}: no candidate could be predicted"}
    # the last look the runs reached decides: replay the looks in order, as the flow took them
    n = len(tpot[BASELINE])
    step = next_step(tpot, labels, max_runs=max_runs, alpha=alpha)
    level = (step.get("look") or {}).get("level", 0.0)
    tests = step.get("tests") or _tests(tpot, labels)
    for (i, k), label in zip(pairs, labels, strict=True):
        t = tests[label]
        out["pairs"].append({
            "candidate": i, "name": names[i], "k": k, "label": label,
            **summarize_values(tpot[label]), "ratio_to_baseline": t["ratio"],
            "p_faster": t["p_faster"], "p_slower": t["p_slower"],
            "faster_than_baseline": t["p_faster"] is not None and t["p_faster"] <= level,
        })  # fmt: skip
    shown = [p for p in out["pairs"] if p["faster_than_baseline"]]
    if not shown:
        why = (
            "the runs never reached a look"
            if step["action"] != "decide now"
            else f"no pair shown faster than the baseline at level {level:.3g} ({n} runs per arm)"
        )
        return {**out, "recommended": None, "verdict": f"{OFF}: {why}"}
    win = min(shown, key=lambda p: (median(tpot[p["label"]]), p["candidate"]))
    return {
        **out,
        "recommended": {"candidate": win["candidate"], "name": win["name"], "k": win["k"]},
        "verdict": f"{win['name']} at k = {win['k']}: faster than the baseline (TPOT ratio "
        f"{win['ratio_to_baseline']:.3f}, p = {win['p_faster']:.3g} <= {level:.3g}, alpha "
        f"{alpha:g} over {len(labels)} pairs and the looks)",
    }


def host_data_change(host: str, decision: Mapping, speculative_configs: Sequence[Mapping]) -> str:
    """What to set in host data: the winner's speculative_config, or the gate-free "off"."""
    rec = decision.get("recommended")
    if rec is None:
        return f"host_data/{host}: no draft beat the baseline; leave speculation off"
    return f"host_data/{host}: speculative_config = {dict(sorted(speculative_configs[rec['candidate']].items()))!r}"  # noqa: E501


def draft_choice(
    candidates: Sequence[Mapping],
    results: Sequence[BenchResult | Mapping],
    *,
    ks: Sequence[int],
    max_runs: int,
    alpha: float,
    levels: Sequence[int] | None = None,
) -> dict:
    """The record (raw/<host>/draft_choice.json, summary.json): every candidate (refused ones by
    name with why, the others with their pin evidence, predicted and measured TPOT), the pairs
    proven, the decision and alpha. `candidates`: [{name, refused (list of reasons, empty when
    measured), download_bytes, kv_tokens, ...}] as the flow found them. `levels`: the workload's
    load levels (concurrencies), when it has them: each level's pairs and decision under
    `levels`, each candidate's evidence per level, the decision across them."""
    if levels:
        return _at_levels(candidates, results, ks=ks, max_runs=max_runs, alpha=alpha,
                          levels=list(levels))  # fmt: skip
    evidence = curves(results, ks)
    pairs = best_pairs(evidence)
    names = [c["name"] for c in candidates]
    decision = decide(results, pairs, names, max_runs=max_runs, alpha=alpha)
    measured = {p["candidate"]: p for p in decision["pairs"]}
    rows = []
    for i, c in enumerate(candidates):
        e = evidence.get(i, {})
        rows.append({**c, "index": i, **{key: e.get(key) for key in (
            "pinned_k", "per_position_acceptance", "acceptance_length", "pin_tpot_ms",
            "best_k", "predicted_tpot_ms", "rows")},
            "proven_k": measured.get(i, {}).get("k"),
            "measured_tpot_ms": measured.get(i, {}).get("median")})  # fmt: skip
    return {"candidates": rows, "pairs": [list(p) for p in pairs], "alpha": alpha,
            "decision": decision}  # fmt: skip


# --- at load levels -------------------------------------------------------------------------------

LEVEL_RULE = (
    "at every load level on its own runs at alpha / levels; recommended: the pair shown faster "
    "than the baseline at every level with the lowest worst-level TPOT ratio, else speculation off"
)
EVIDENCE = ("pinned_k", "per_position_acceptance", "acceptance_length", "pin_tpot_ms", "best_k",
            "predicted_tpot_ms", "rows", "proven_k", "measured_tpot_ms")  # fmt: skip


def level_runs(results: Sequence[BenchResult | Mapping], concurrency: int) -> list[BenchResult]:
    """The counted runs at one load level, labelled as without levels (d0-k4@c4 -> d0-k4), so
    every rule above reads one level's runs as it reads a run without levels."""
    out = []
    for r in counted(results):
        parts = split_label(r.run.arm)
        if parts and parts[1] == concurrency:
            out.append(r.model_copy(update={"run": r.run.model_copy(update={"arm": parts[0]})}))
    return out


def level_pairs(
    results: Sequence[BenchResult | Mapping], ks: Sequence[int], levels: Sequence[int]
) -> dict[int, list[tuple[int, int]]]:
    """{concurrency: the pairs to prove there} from each level's pin runs."""
    return {c: best_pairs(curves(level_runs(results, c), ks)) for c in levels}


def union_pairs(by_level: Mapping) -> list[tuple[int, int]]:
    """Every level's pairs once: the arms the proof visits (each visit runs every level)."""
    return sorted({tuple(p) for pairs in by_level.values() for p in pairs})


def level_steps(
    results: Sequence[BenchResult | Mapping],
    by_level: Mapping[int, Sequence[tuple[int, int]]],
    *,
    max_runs: int,
    alpha: float = DEFAULT_ALPHA,
) -> dict[int, dict]:
    """next_step at every level over its own pairs at alpha / levels; the proof stops once every
    level says "decide now"."""
    each = level_alpha(alpha, len(by_level))
    out = {}
    for c, pairs in by_level.items():
        labels = [arm_label(i, k) for i, k in pairs]
        if not labels:
            out[c] = {"action": "decide now", "reason": "no candidate could be predicted"}
            continue
        tpot = tpot_by_label(level_runs(results, c))
        out[c] = next_step(tpot, labels, max_runs=max_runs, alpha=each)
    return out


def across_levels(decisions: Mapping[str, Mapping], *, alpha: float, max_runs: int) -> dict:
    """The recommendation from each level's decision ({str(concurrency): decide()'s})."""
    faster = [{(p["candidate"], p["k"]): p for p in d["pairs"] if p["faster_than_baseline"]}
              for d in decisions.values()]  # fmt: skip
    common = set.intersection(*(set(f) for f in faster)) if faster else set()
    first = next(iter(decisions.values()), {})
    out = {"alpha": alpha, "rule": f"{DRAFT_RULE}; {LEVEL_RULE}", "max_runs": max_runs,
           "pairs": first.get("pairs", []), "baseline": first.get("baseline"),
           "levels": {c: d["verdict"] for c, d in decisions.items()}}  # fmt: skip
    each = "; ".join(f"c{c}: {d['verdict']}" for c, d in decisions.items())
    if not common:
        return {**out, "recommended": None,
                "verdict": f"{OFF}: no draft and k shown faster than the baseline at every load "
                f"level ({each})"}  # fmt: skip
    worst = {p: max(f[p]["ratio_to_baseline"] for f in faster) for p in common}
    i, k = min(common, key=lambda p: (worst[p], p))
    name = faster[0][(i, k)]["name"]
    verdict = (f"{name} at k = {k}: faster than the baseline at every load level (worst TPOT "
               f"ratio {worst[(i, k)]:.3f}, alpha {alpha:g} over the levels; {each})")  # fmt: skip
    return {**out, "recommended": {"candidate": i, "name": name, "k": k}, "verdict": verdict}


def _at_levels(candidates, results, *, ks, max_runs, alpha, levels) -> dict:
    each = level_alpha(alpha, len(levels))
    per = {str(c): draft_choice(candidates, level_runs(results, c), ks=ks, max_runs=max_runs,
                                alpha=each) for c in levels}  # fmt: skip
    first = per[str(levels[0])]
    rows = [{**row, "levels": {c: {key: per[c]["candidates"][n][key] for key in EVIDENCE}
                               for c in per}}
            for n, row in enumerate(first["candidates"])]  # fmt: skip
    decision = across_levels({c: ch["decision"] for c, ch in per.items()}, alpha=alpha,
                             max_runs=max_runs)  # fmt: skip
    return {"candidates": rows, "alpha": alpha,
            "pairs": [list(p) for p in union_pairs({c: ch["pairs"] for c, ch in per.items()})],
            "levels": {c: {"pairs": ch["pairs"], "decision": ch["decision"]}
                       for c, ch in per.items()},
            "decision": decision}  # fmt: skip


def replay(choice: Mapping) -> dict:
    """A recorded draft_choice (draft_choice.json, the report's, or a deployment record's) through
    the rules again from what it keeps: the pairs from each candidate's recorded pin evidence
    (best_pairs), the decision from the proving runs' TPOTs (decide_tpot). Returns {pairs,
    decision}: equal to the recorded ones unless the rules changed since."""
    names = [c["name"] for c in choice["candidates"]]
    recorded = choice["decision"]
    if choice.get("levels"):
        each = level_alpha(choice["alpha"], len(choice["levels"]))
        per = {}
        for c, level in choice["levels"].items():
            pairs = best_pairs({row["index"]: row["levels"][c] for row in choice["candidates"]})
            tpot = level["decision"].get("tpot") or {}
            per[c] = {"pairs": [list(p) for p in pairs],
                      "decision": decide_tpot(tpot, pairs, names, max_runs=recorded["max_runs"],
                                              alpha=each)}  # fmt: skip
        decision = across_levels({c: lv["decision"] for c, lv in per.items()},
                                 alpha=choice["alpha"], max_runs=recorded["max_runs"])  # fmt: skip
        pairs = [list(p) for p in union_pairs({c: lv["pairs"] for c, lv in per.items()})]
        return {"pairs": pairs, "decision": decision, "levels": per}
    pairs = best_pairs({c["index"]: c for c in choice["candidates"]})
    decision = decide_tpot(recorded.get("tpot") or {}, pairs, names,
                           max_runs=recorded["max_runs"], alpha=choice["alpha"])  # fmt: skip
    return {"pairs": [list(p) for p in pairs], "decision": decision}
