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
from tests.unit.handed import handed

SPREAD = (0.97, 0.99, 1.0, 1.01, 1.03)


def write_run(
    run_dir: Path, cfg, plan, tpot_ms: dict[str, dict[int, float]], kind: str, **extra
) -> None:
    """raw/gpu-1/: conditions.json (with `extra`) and one NN-<label>.json per step of `plan`, each
    run's TPOT the arm's median at its level times the next factor of SPREAD."""
    raw = run_dir / "raw" / "gpu-1"
    raw.mkdir(parents=True)
    cond = {**conditions(cfg, plan.conditions(), restart_between_samples=VISIT_NOTE)}
    cond |= {"kind": kind, "host": "gpu-1", "finished_at": "2026-12-04T00:00:00+00:00", **extra}
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
    plan = LoadTune(cfg, (1, 3), repeats=5, warmup_runs=1, **handed(cfg))
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
    plan = LoadProof(cfg, 1, repeats=5, warmup_runs=0, **handed(cfg))
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
    plan = LoadProof(cfg, 3, repeats=5, warmup_runs=0, schedule=candidate, **handed(cfg))
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


CANDIDATE = ((1, 2, 3), (3, 4, 0))
WINS = {
    "baseline": {1: 40.0, 2: 45.0, 4: 50.0},
    "schedule": {1: 20.0, 2: 30.0, 4: 50.3},
    "fixed": {1: 20.2, 2: 30.1, 4: 75.0},
}
H200 = {"device": "gpu", "gpus": ["NVIDIA H200 143771 MiB"], "driver": "570.1", "cuda": "12.8"}


def proof_run(root: Path, cfg, fingerprint, name="proof-run", finished="2026-12-04T00:00:00+00:00"):
    """A compare_across_load run of CANDIDATE on gpu-1 whose conditions carry `fingerprint` (as
    flows/measure.py writes them), reported and kept as the flow keeps it."""
    from specdeploy.report.load_summary import keep_proofs

    plan = LoadProof(cfg, 3, repeats=5, warmup_runs=0, schedule=CANDIDATE, **handed(cfg))
    write_run(root / name, cfg, plan, WINS, "compare", proof_fingerprint=fingerprint,
              finished_at=finished)  # fmt: skip
    return keep_proofs(root / name, report.write(root / name, "compare"))


def deployed(**data):
    """The config that deploys CANDIDATE as the proof's host-data line says."""
    from specdeploy.decide.load_rule import schedule_config

    cfg = cfg_with(**data)
    return cfg.model_copy(update={"speculative_config": schedule_config(cfg.speculative_config,
                                                                        CANDIDATE)})  # fmt: skip


def test_a_proof_is_kept_by_its_full_fingerprint_and_found_by_nothing_less(tmp_path):
    """report/load_summary: a proof is kept under its fingerprint's key and found only for exactly
    that fingerprint: another release, target or draft revision, workload, request set, schedule or
    hardware finds nothing (main matched host and schedule alone: each of these was 'proven')."""
    from specdeploy.report.load_summary import kept_proof, proof_fingerprint

    cfg = cfg_with()
    measured = proof_fingerprint(deployed(), H200)
    (path,) = proof_run(tmp_path, cfg, measured)
    assert path == tmp_path / "proofs" / f"{json.loads(path.read_text())['key']}.json"
    found = kept_proof(tmp_path, proof_fingerprint(deployed(), H200))
    assert (
        found["proven"] is True and found["run"] == "proof-run" and found["measured_on"] == "gpu-1"
    )
    assert set(found["levels"]) == {"1", "2", "4"} and found["levels"]["1"]["verdict"] == "better"
    assert found["proven_range"] == [1, 4]
    workload = {**VALID["workload"], "load_levels": [1, 2, 8]}
    draft = {**VALID["speculative_config"], "revision": "b" * 40}
    others = {
        "release": proof_fingerprint(deployed(vllm_version="0.33.0"), H200),
        "target revision": proof_fingerprint(deployed(target_revision="c" * 40), H200),
        "draft revision": proof_fingerprint(deployed(speculative_config=draft), H200),
        "workload": proof_fingerprint(deployed(workload=workload), H200),
        "hardware": proof_fingerprint(deployed(), {**H200, "gpus": H200["gpus"] * 2}),
        "schedule": proof_fingerprint(cfg, H200, {**measured["speculative_config"],
                                                   SCHEDULE_KEY: [[1, 4, 3], [5, 8, 0]]}),
        "request set": {**measured, "request_set_sha256": "0" * 64},
    }  # fmt: skip
    for what, fingerprint in others.items():
        assert fingerprint != measured, what
        assert kept_proof(tmp_path, fingerprint) is None, what


def test_a_proof_is_kept_newest_by_its_own_time_not_by_the_file(tmp_path):
    """A re-rendered older run (written last) does not replace a newer proof of the same
    fingerprint; a proof without a fingerprint (made before them) is not kept at all."""
    from specdeploy.report.load_summary import kept_proof, proof_fingerprint

    cfg = cfg_with()
    fingerprint = proof_fingerprint(deployed(), H200)
    proof_run(tmp_path, cfg, fingerprint, "new", finished="2026-12-04T10:00:00+00:00")
    assert proof_run(tmp_path, cfg, fingerprint, "old", finished="2026-12-01T10:00:00+00:00") == []
    assert kept_proof(tmp_path, fingerprint)["run"] == "new"
    assert proof_run(tmp_path, cfg, None, "unfingerprinted") == []
