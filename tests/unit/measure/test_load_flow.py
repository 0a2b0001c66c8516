"""Measuring across load levels (measure/load_flow.py, issue 39): which visits run, in which order,
on which servers, and how their runs are read back per level."""

from __future__ import annotations

import math

from specdeploy.config.record import BenchResult
from specdeploy.config.schema import config_from_data
from specdeploy.decide.load_rule import SCHEDULE_KEY, split_label, tpot_by_level
from specdeploy.measure.load_flow import (
    LoadProof,
    LoadTune,
    proof_runs_per_arm,
    tune_runs_per_arm,
)
from tests.unit.conftest import VALID
from tests.unit.handed import handed

LEVELS = {"load_levels": [1, 2, 4]}


def cfg_with(**data):
    workload = {**VALID["workload"], **LEVELS}
    return config_from_data({**VALID, "workload": workload, **data})


def test_a_tune_visit_is_one_fresh_server_and_one_run_per_level_lowest_first():
    cfg = cfg_with()
    steps = list(LoadTune(cfg, (1, 3), repeats=2, warmup_runs=1, **handed(cfg)))
    labels = [(s.arm.label, s.warmup, s.same_server) for s in steps]
    assert labels[0] == ("baseline@c1", True, False)  # the warm-up: one discarded run
    counted = labels[1:]
    assert len(counted) == 2 * 3 * 3  # rounds x arms x levels
    visits = [counted[i : i + 3] for i in range(0, len(counted), 3)]
    assert [split_label(v[0][0])[0] for v in visits] == [
        "baseline",
        "k1",
        "k3",
        "k1",
        "k3",
        "baseline",
    ]
    for v in visits:  # a fresh server first, then the higher levels on the same one
        assert [split_label(label)[1] for label, _, _ in v] == [1, 2, 4]
        assert [same for _, _, same in v] == [False, True, True]
    step = steps[6]  # k1's visit (after the warm-up and the baseline's), level 4
    assert step.arm.label == "k1@c4" and step.arm.speculative_config["num_speculative_tokens"] == 1
    assert step.arm.workload.max_concurrency == 4 and math.isinf(step.arm.workload.request_rate)


def test_runs_per_arm_pay_for_the_correction_across_levels():
    cfg = cfg_with()
    assert tune_runs_per_arm(cfg, [3], 0.05) == 4  # 1/70 <= 0.05 / 3
    assert tune_runs_per_arm(cfg, [1, 3], 0.05) == 5  # 1/252 <= 0.05 / 3 / 2
    assert proof_runs_per_arm(cfg, 0.05) == 5  # two-sided 2/252 <= 0.05 / 3 (2/70 is not)
    assert proof_runs_per_arm(cfg, 0.1) == 4


def test_the_proof_runs_the_schedule_the_baseline_and_the_fixed_k():
    spec = {**VALID["speculative_config"], "num_speculative_tokens": 3}
    plain = cfg_with(speculative_config=spec)
    plain = LoadProof(plain, None, repeats=1, warmup_runs=0, **handed(plain))
    assert [a.label for a in plain.arms()] == ["baseline", "speculative"]
    scheduled = {**spec, SCHEDULE_KEY: [[1, 2, 3], [3, 8, 0]]}
    scheduled_cfg = cfg_with(speculative_config=scheduled, max_num_seqs=8)
    proof = LoadProof(scheduled_cfg, 1, 1, 0, **handed(scheduled_cfg))
    arms = {a.label: a for a in proof.arms()}
    assert list(arms) == ["baseline", "schedule", "fixed"]
    assert arms["schedule"].speculative_config is None  # the deployed config, as it is
    assert arms["fixed"].speculative_config == {**spec, "num_speculative_tokens": 1}
    assert proof.conditions()["fixed_k"] == 1 and proof.conditions()["across_load"] is True
    assert len(list(proof)) == 3 * 3


def test_runs_are_read_back_per_level_and_arm_without_warm_ups():
    def result(index, arm, tpot, warmup=False):
        return BenchResult.model_validate(
            {"median_tpot_ms": tpot, "specdeploy": {"arm": arm, "index": index, "warmup": warmup}}
        )

    results = [
        result(0, "baseline@c1", 99.0, warmup=True),
        result(1, "baseline@c1", 10.0),
        result(2, "baseline@c4", 12.0),
        result(3, "k3@c1", 6.0),
        result(4, "k3@c4", 14.0),
        result(5, "k3@c1", 6.5),
    ]
    assert tpot_by_level(results) == {
        1: {"baseline": [10.0], "k3": [6.0, 6.5]},
        4: {"baseline": [12.0], "k3": [14.0]},
    }
