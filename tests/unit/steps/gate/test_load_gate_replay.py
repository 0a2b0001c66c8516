"""The speculation gate across load levels replayed on a live run: the trained sandbox pair with a
deployed schedule [[1, 1, 3], [2, 4, 1]] gated at concurrency 1, 2 and 4 by
tests/integration/test_load_gate.py, which records `trained_load_gate`: the deployment record
(record.json, its gate with the per-level evidence) and the gate's raw bench files (bench/).

The gate's rule (decide/gate_rule.across_load_decision) run again on the raw files must reach the
recorded decision exactly and its figures to 1e-9; each level's verdicts are recomputed here from
the raw JSONs without specdeploy's statistics. Only what holds for ANY recording is asserted:
whether the schedule won on that machine is read from the runs."""

from __future__ import annotations

from specdeploy.decide.gate_rule import across_load_decision
from specdeploy.decide.load_rule import split_label, tpot_by_level
from tests.unit.replays import approx_tree, load, rank_p_less, recording

NAME = "trained_load_gate"


def recorded():
    path = recording(NAME)
    record = load(path / "record.json")
    bench = [load(p) for p in sorted((path / "bench").glob("*.json"))]
    return record, bench


def test_the_gate_across_load_decides_as_recorded_from_its_raw_runs():
    record, bench = recorded()
    gate = record["gate"]
    evidence = gate["across_load"]
    again = across_load_decision(
        tpot_by_level(bench),
        schedule=evidence["schedule"],
        fixed_k=evidence["fixed_k"],
        on_fail=gate["on_fail"],
        alpha=gate["alpha"],
    )
    for key in ("passed", "verdict", "action", "conclusive", "reason"):
        assert again[key] == gate[key], key
    levels = {str(c): v for c, v in again["across_load"]["levels"].items()}  # as JSON keeps them
    relived = {**again["across_load"], "levels": levels}
    assert relived == approx_tree(evidence)


def test_each_level_is_decided_as_its_raw_runs_say():
    record, bench = recorded()
    gate, evidence = record["gate"], record["gate"]["across_load"]
    runs: dict[int, dict[str, list[float]]] = {}
    for r in bench:  # one visit = one fresh server, its levels lowest first
        arm, c = split_label(r["specdeploy"]["arm"])
        runs.setdefault(c, {}).setdefault(arm, []).append(r["median_tpot_ms"])
    each = evidence["level_alpha"]
    assert each == gate["alpha"] / len(runs)
    slower = [
        c for c in sorted(runs) if 2 * rank_p_less(runs[c]["baseline"], runs[c]["schedule"]) <= each
    ]
    faster = [
        c for c in sorted(runs) if 2 * rank_p_less(runs[c]["schedule"], runs[c]["baseline"]) <= each
    ]
    behind = [
        c for c in sorted(runs) if 2 * rank_p_less(runs[c]["fixed"], runs[c]["schedule"]) <= each
    ]
    assert evidence["slower_at"] == slower and evidence["faster_at"] == faster
    assert evidence["behind_fixed_at"] == behind
    assert gate["passed"] == (bool(faster) and not slower and not behind)
    assert record["role"] == ("speculative" if gate["passed"] else "baseline")
