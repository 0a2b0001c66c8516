"""The report of a run across load levels (report/load_summary.py, charts.load_chart), built from
raw files written the way harness.sample writes them, for the plans load_flow.py makes: a tune
whose runs show the crossover (speculation pays at low load, loses at high) recommends a
candidate schedule and the safe fallback; a proof of a schedule that lost at every level (the
H200 case) keeps it off."""

from __future__ import annotations

import json
from pathlib import Path

from specdeploy.config.schema import config_from_data
from specdeploy.decide.load_rule import SCHEDULE_KEY, split_label
from specdeploy.measure.load_flow import LoadProof, LoadTune
from specdeploy.measure.plans import VISIT_NOTE, conditions
from specdeploy.report import summary as report
from tests.unit.conftest import VALID

SPREAD = (0.97, 0.99, 1.0, 1.01, 1.03)


def write_run(run_dir: Path, cfg, plan, tpot_ms: dict[str, dict[int, float]], kind: str) -> None:
    """raw/gpu-1/: conditions.json and one NN-<label>.json per step of `plan`, each run's TPOT
    the arm's median at its level times the next factor of SPREAD."""
    raw = run_dir / "raw" / "gpu-1"
    raw.mkdir(parents=True)
    cond = {**conditions(cfg, plan.conditions(), restart_between_samples=VISIT_NOTE)}
    cond |= {"kind": kind, "host": "gpu-1", "finished_at": "2026-12-04T00:00:00+00:00"}
    raw.joinpath("conditions.json").write_text(json.dumps(cond, default=str))
    seen: dict[str, int] = {}
    for i, (arm, warmup, same_server) in enumerate(plan):
        base, c = split_label(arm.label)
        n = seen[arm.label] = seen.get(arm.label, -1) + (0 if warmup else 1)
        tpot = tpot_ms[base][c] * SPREAD[max(n, 0) % len(SPREAD)]
        result = {
            "median_tpot_ms": tpot,
            "completed": 4,
            "specdeploy": {"arm": arm.label, "index": i, "warmup": warmup,
                           "speculative": arm.speculative, "fresh_server": not same_server,
                           "speculative_config": arm.config(cfg).speculative_config
                           if arm.speculative else None},
        }  # fmt: skip
        raw.joinpath(f"{i:02d}-{arm.label}.json").write_text(json.dumps(result))


def cfg_with(**data):
    workload = {**VALID["workload"], "load_levels": [1, 2, 4]}
    return config_from_data({**VALID, "workload": workload, **data})


def test_a_load_tune_reports_the_crossover_a_candidate_schedule_and_the_plot(tmp_path):
    cfg = cfg_with()
    plan = LoadTune(cfg, (1, 3), repeats=5, warmup_runs=1)
    tpot = {
        "baseline": {1: 40.0, 2: 45.0, 4: 50.0},
        "k1": {1: 30.0, 2: 36.0, 4: 60.0},
        "k3": {1: 20.0, 2: 44.0, 4: 75.0},
    }
    write_run(tmp_path, cfg, plan, tpot, "tune")
    s = report.write(tmp_path, "tune")
    h = s["hosts"]["gpu-1"]
    assert h["decision"]["best_k"] == {"1": 3, "2": 1, "4": 0}
    rec = h["recommendation"]
    assert rec["schedule"] == [[1, 1, 3], [2, 2, 1], [3, 4, 0]]
    assert rec["recommended"] == "schedule candidate" and rec["fixed"]["k"] is None
    assert "k = 1 pays at 1, 2 but loses at 4" in rec["verdict"]
    # what to run now is the fallback; the candidate is only named for its proof, never deployed
    assert (
        h["host_data_change"] == "host_data/gpu-1: leave speculation off (deploy without "
        "speculative_config)"
    )
    assert h["prove_with"] == (
        "SPECDEPLOY_COMPARE_ACROSS_LOAD=1 SPECDEPLOY_COMPARE_SCHEDULE='[[1, 1, 3], [2, 2, 1], "
        "[3, 4, 0]]' SPECDEPLOY_COMPARE_FIXED_K=5 pyinfra INVENTORY deploys/compare.py"
    )
    assert h["ratios"]["k3"]["1"]["ratio"] == 0.5 and h["ratios"]["k1"]["4"]["ratio"] == 1.2
    assert s["charts"] == ["load_ratio.png"] and (tmp_path / "load_ratio.png").stat().st_size
    md = (tmp_path / "summary.md").read_text()
    assert "| 4 | 1.20" in md and "Prove the candidate schedule" in md
    assert json.loads((tmp_path / "summary.json").read_text())["hosts"]["gpu-1"]["decision"]


def test_a_schedule_that_lost_at_every_level_is_reported_off(tmp_path):
    spec = {**VALID["speculative_config"], "num_speculative_tokens": 3,
            SCHEDULE_KEY: [[1, 4, 3], [5, 24, 1], [25, 64, 0]]}  # fmt: skip
    workload = {**VALID["workload"], "load_levels": [1, 16, 64]}
    cfg = config_from_data({**VALID, "speculative_config": spec, "workload": workload,
                            "max_num_seqs": 64})  # fmt: skip
    plan = LoadProof(cfg, 1, repeats=5, warmup_runs=0)
    tpot = {  # the H200 sweep (shared/gpu/load-sweep-2026-12-04), medians in ms
        "baseline": {1: 5.18, 16: 5.51, 64: 7.40},
        "schedule": {1: 8.23, 16: 12.17, 64: 14.65},
        "fixed": {1: 4.87, 16: 7.72, 64: 11.26},
    }
    write_run(tmp_path, cfg, plan, tpot, "compare")
    s = report.write(tmp_path, "compare")
    h = s["hosts"]["gpu-1"]
    p = h["proof"]
    assert not p["proven"] and p["decision"] == "off" and p["slower_at"] == [1, 16, 64]
    assert h["proven_range"] is None and h["schedule"] == spec[SCHEDULE_KEY]
    assert set(h["ratios"]) == {"schedule", "fixed"}
    assert (
        h["host_data_change"] == "host_data/gpu-1: leave speculation off (deploy without "
        "speculative_config)"
    )
    assert "the schedule is not deployed" in (tmp_path / "summary.md").read_text()


def test_a_candidate_schedule_proven_winning_is_what_to_deploy(tmp_path):
    """compare_schedule: the candidate runs as an arm (the deployed config stays k = 5 without a
    schedule) against the baseline and the fixed k; proven, its host-data line is printed."""
    cfg = cfg_with()
    candidate = ((1, 2, 3), (3, 4, 0))
    plan = LoadProof(cfg, 3, repeats=5, warmup_runs=0, schedule=candidate)
    arms = {a.label: a for a in plan.arms()}
    assert arms["schedule"].speculative_config[SCHEDULE_KEY] == [[1, 2, 3], [3, 4, 0]]
    assert arms["fixed"].speculative_config["num_speculative_tokens"] == 3
    assert SCHEDULE_KEY not in arms["fixed"].speculative_config
    tpot = {
        "baseline": {1: 40.0, 2: 45.0, 4: 50.0},
        "schedule": {1: 20.0, 2: 30.0, 4: 50.3},
        "fixed": {1: 20.2, 2: 30.1, 4: 75.0},
    }
    write_run(tmp_path, cfg, plan, tpot, "compare")
    h = report.write(tmp_path, "compare")["hosts"]["gpu-1"]
    assert h["proof"]["proven"] and h["proven_range"] == [1, 4] and h["deployed"] == "schedule"
    assert h["schedule"] == [[1, 2, 3], [3, 4, 0]]
    assert f"'{SCHEDULE_KEY}': [[1, 2, 3], [3, 4, 0]]" in h["host_data_change"]
    assert "'num_speculative_tokens': 3" in h["host_data_change"]


def test_a_deployed_schedule_carries_its_proof_into_the_record(tmp_path):
    """steps/record.py adds schedule_evidence: the newest proof of exactly this schedule on this
    host, level by level; None where none was run; nothing for a config without a schedule."""
    from specdeploy.config.record import DeploymentRecord
    from specdeploy.report.load_summary import schedule_evidence

    cfg = cfg_with()
    candidate = ((1, 2, 3), (3, 4, 0))
    plan = LoadProof(cfg, 3, repeats=5, warmup_runs=0, schedule=candidate)
    tpot = {
        "baseline": {1: 40.0, 2: 45.0, 4: 50.0},
        "schedule": {1: 20.0, 2: 30.0, 4: 50.3},
        "fixed": {1: 20.2, 2: 30.1, 4: 75.0},
    }
    write_run(tmp_path / "proof-run", cfg, plan, tpot, "compare")
    report.write(tmp_path / "proof-run", "compare")
    spec = {**cfg.speculative_config, SCHEDULE_KEY: [[1, 2, 3], [3, 4, 0]]}
    evidence = schedule_evidence(tmp_path, "gpu-1", spec)["schedule_proof"]
    assert evidence["run"] == "proof-run" and evidence["proven"] is True
    assert set(evidence["levels"]) == {"1", "2", "4"}
    assert evidence["levels"]["1"]["verdict"] == "better"
    assert evidence["levels"]["1"]["ratio"] == 0.5
    assert evidence["levels"]["4"]["verdict"] == "no significant difference"
    other = {**spec, SCHEDULE_KEY: [[1, 4, 3], [5, 8, 0]]}  # not the schedule that was proven
    assert schedule_evidence(tmp_path, "gpu-1", other) == {"schedule_proof": None}
    assert schedule_evidence(tmp_path, "gpu-2", spec) == {"schedule_proof": None}
    assert schedule_evidence(tmp_path, "gpu-1", cfg.speculative_config) == {}
    assert DeploymentRecord.model_fields["schedule_proof"].default is None
