"""The speculation gate across load levels (speculation_gate.across_load, issue 39): its pure rule
(decide/gate_rule.across_load_decision, compare_across_load's proof rule) on synthetic per-level
runs shaped like the H200 load sweep (shared/gpu/load-sweep-2026-12-04) and the sandbox's CPU
engine, and its opt-in key (config/schema.SpeculationGate)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from specdeploy.config.schema import SpeculationGate, config_from_data
from specdeploy.decide.decisions import TOO_FEW_RUNS
from specdeploy.decide.gate_rule import (
    ACROSS_LOAD_BEHIND,
    ACROSS_LOAD_PASSED,
    ACROSS_LOAD_SLOWER,
    across_load_decision,
)
from specdeploy.decide.load_rule import proof_runs

SPREAD = (0.97, 0.99, 1.0, 1.01, 1.03)  # five fresh-server runs around a median, 3 % apart
SCHEDULE = [[1, 4, 3], [5, 24, 1], [25, 64, 0]]


def runs(median_ms: float, n: int = 5) -> list[float]:
    return [median_ms * f for f in SPREAD[:n]]


def levels(table: dict, n: int = 5) -> dict:
    """{c: (baseline, schedule, fixed) medians} -> the gate's runs."""
    return {
        c: {"baseline": runs(b, n), "schedule": runs(s, n), "fixed": runs(f, n)}
        for c, (b, s, f) in table.items()
    }


def decide(table: dict, n: int = 5, on_fail: str = "baseline", alpha: float = 0.05) -> dict:
    return across_load_decision(
        levels(table, n), schedule=SCHEDULE, fixed_k=3, on_fail=on_fail, alpha=alpha
    )


def test_the_h200_schedule_that_lost_everywhere_falls_back_naming_every_level():
    # the sweep's schedule ran 8.23 / 12.17 / 14.65 ms against the baseline's 5.18 / 5.51 / 7.40
    g = decide({1: (5.18, 8.23, 6.50), 16: (5.51, 12.17, 7.27), 64: (7.40, 14.65, 11.67)})
    assert not g["passed"] and g["conclusive"] and g["verdict"] == ACROSS_LOAD_SLOWER
    assert g["action"] == "switch to baseline"
    assert g["across_load"]["slower_at"] == [1, 16, 64]
    assert "slower than the baseline at concurrency 1, 16, 64" in g["reason"]
    assert g["across_load"]["instead"] is None  # the fixed k loses at 16 and 64 too


def test_a_schedule_that_wins_low_and_ties_high_is_kept_with_its_evidence():
    g = decide({1: (40.0, 20.0, 20.5), 4: (50.0, 38.0, 45.0), 16: (60.0, 60.3, 90.0)})
    assert g["passed"] and g["verdict"] == ACROSS_LOAD_PASSED and g["action"] == "keep the schedule"
    ev = g["across_load"]
    assert ev["faster_at"] == [1, 4] and ev["slower_at"] == [] and ev["behind_fixed_at"] == []
    assert ev["schedule"] == SCHEDULE and ev["fixed_k"] == 3
    assert ev["level_alpha"] == pytest.approx(0.05 / 3)
    # every level keeps each arm's runs and the schedule's ratio to the baseline with its bounds
    assert set(ev["levels"]) == {1, 4, 16}
    at1 = ev["levels"][1]
    assert at1["tpot_ms"]["schedule"]["median"] == pytest.approx(20.0)
    assert at1["vs_baseline"]["ratio"] == pytest.approx(0.5)
    assert at1["vs_baseline"]["high"] < 1 and at1["vs_baseline"]["verdict"] == "better"


def test_a_schedule_slower_than_the_baseline_at_one_level_falls_back_naming_it():
    # wins at 1 and 4, loses at 16: the collapse a schedule boundary can bring (vllm#49548)
    g = decide({1: (40.0, 20.0, 20.5), 4: (50.0, 38.0, 45.0), 16: (60.0, 75.0, 90.0)})
    assert not g["passed"] and g["verdict"] == ACROSS_LOAD_SLOWER
    assert g["across_load"]["slower_at"] == [16] and g["across_load"]["faster_at"] == [1, 4]
    assert "concurrency 16" in g["reason"] and g["reason"].endswith("-> switch to baseline")


def test_behind_the_fixed_k_falls_back_to_the_baseline_and_says_how_to_deploy_the_fixed_k():
    g = decide({1: (40.0, 30.0, 20.0), 4: (50.0, 40.0, 40.0)})
    assert not g["passed"] and g["verdict"] == ACROSS_LOAD_BEHIND
    assert g["action"] == "switch to baseline"  # never a config the gate did not render and run
    assert g["across_load"]["fixed_proven"] and g["across_load"]["behind_fixed_at"] == [1]
    assert "set num_speculative_tokens = 3 and drop" in g["across_load"]["instead"]
    assert g["across_load"]["instead"] in g["reason"]


def test_on_fail_fail_fails_the_deploy():
    g = decide({1: (5.18, 8.23, 6.50), 16: (5.51, 12.17, 7.27)}, on_fail="fail")
    assert not g["passed"] and g["action"] == "fail the deploy" and g["on_fail"] == "fail"


def test_runs_too_few_for_alpha_over_the_levels_never_keep_the_schedule():
    # 3 + 3 runs reach two-sided p = 0.1 at best: nothing at 0.05 / 3
    assert proof_runs(3, 0.05) == 5 and proof_runs(2, 0.05) == 5 and proof_runs(2, 0.1) == 4
    g = decide({1: (40.0, 20.0, 20.5), 4: (50.0, 38.0, 45.0), 16: (60.0, 60.3, 90.0)}, n=3)
    assert not g["passed"] and g["verdict"] == TOO_FEW_RUNS and not g["conclusive"]
    assert "3 runs per arm cannot reach alpha / 3 (at least 5)" in g["reason"]


def test_a_level_without_one_of_the_three_arms_is_refused():
    bad = levels({1: (40.0, 20.0, 20.5)})
    bad[1]["fixed"] = []
    with pytest.raises(ValueError, match="concurrency 1: no fixed runs"):
        across_load_decision(bad, schedule=SCHEDULE, fixed_k=3, on_fail="baseline")


def test_the_opt_in_is_off_by_default_and_described(valid_data):
    assert SpeculationGate().across_load is False
    assert "every load level" in SpeculationGate.model_fields["across_load"].description
    cfg = config_from_data({**valid_data, "speculation_gate": {"across_load": True}})
    assert cfg.speculation_gate.across_load is True
    with pytest.raises(ValidationError):
        SpeculationGate(across_load="sometimes")


# --- what the gate measures across load, and what its decision depends on (steps/gate.py) --------

SCHEDULED = {
    "speculation_gate": {"across_load": True},
    "speculative_config": {
        "method": "draft_model",
        "model": "Qwen/Qwen3-0.6B",
        "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 16, 1]],
    },
    "workload": {"load_levels": [1, 4]},
}


def gate_of(data: dict):
    from specdeploy.render.units import render_unit
    from specdeploy.steps import gate

    cfg = config_from_data(data)
    return gate.gate_input(cfg, render_unit(cfg, "speculative"))


def test_across_load_measures_the_fixed_k_on_the_measurement_instance(valid_data):
    across = gate_of({**valid_data, **SCHEDULED}).across_load
    assert across.schedule == [[1, 1, 3], [2, 16, 1]] and across.fixed_k == 3
    assert [lv.concurrency for lv in across.levels] == [1, 4]
    assert across.fixed.name == "specdeploy-vllm-measure.service"
    config = json.loads(across.fixed.argv[across.fixed.argv.index("--speculative-config") + 1])
    assert config == {
        "method": "draft_model",
        "model": "Qwen/Qwen3-0.6B",
        "num_speculative_tokens": 3,
    }
    # compare_fixed_k names the best single k tune found
    other = gate_of({**valid_data, **SCHEDULED, "compare_fixed_k": 1}).across_load
    assert other.fixed_k == 1


def test_without_the_opt_in_or_a_schedule_the_gate_and_its_fingerprint_are_as_before(valid_data):
    plain = gate_of({**valid_data, "speculation_gate": {}})
    no_schedule = gate_of({**valid_data, "speculation_gate": {"across_load": True}})
    off = gate_of({**valid_data, **SCHEDULED, "speculation_gate": {}})
    assert plain.across_load is None and no_schedule.across_load is None and off.across_load is None
    assert "across_load" not in plain.fingerprint and "across_load" not in off.fingerprint
    assert plain.fingerprint == no_schedule.fingerprint  # a record written before stays settled


def test_a_new_load_level_or_fixed_k_makes_the_gate_measure_again(valid_data):
    from datetime import UTC, datetime

    from specdeploy.decide.gate_rule import gate_needs_recheck

    first = gate_of({**valid_data, **SCHEDULED})
    previous = {"fingerprint": first.fingerprint, "passed": True, "decided_at": "2026-12-01T17:00Z"}
    wider = {**SCHEDULED, "workload": {"load_levels": [1, 4, 8]}}
    for changed in (wider, {**SCHEDULED, "compare_fixed_k": 1}):
        fp = gate_of({**valid_data, **changed}).fingerprint
        verdict = gate_needs_recheck(previous, fp, now=datetime.now(UTC))
        assert verdict["recheck"] and "across_load" in verdict["why"], verdict
