"""The tune and the proof across load levels replayed on a live run: the trained sandbox pair with
its good draft at concurrency 1, 2 and 4, measured on a sandbox host by
tests/integration/test_load_aware.py, which records `trained_load_tune` (tune_method = load, k =
3) and `trained_load_proof` (compare_across_load on what the tune recommended: its candidate
schedule as an arm, or the single k): raw/<host>/
NN-<arm>@c<level>.json and conditions.json, summary.json, provenance.json.

The plans (measure/load_flow.py) rebuilt from the recorded conditions must ask for exactly the
recorded runs in their order, on the same servers (a fresh start per visit, the higher levels on
it); the report rebuilt from the raw files must reach the recorded decisions exactly; and each
level's decision is recomputed here from the raw JSONs without specdeploy's statistics. Only what
holds for ANY recording of that live test is asserted: whether the crossover showed on that
machine is read from the runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specdeploy.config.schema import config_from_data
from specdeploy.decide.load_rule import SCHEDULE_KEY, k_at, schedule_problems, split_label
from specdeploy.measure.load_flow import LoadProof, LoadTune
from specdeploy.report import summary as report
from tests.unit.conftest import VALID
from tests.unit.handed import handed
from tests.unit.replays import approx_tree, load, rank_p_less, recording

TUNE, PROOF = "trained_load_tune", "trained_load_proof"


def host_of(path: Path) -> str:
    (host,) = [d.name for d in (path / "raw").iterdir() if d.is_dir()]
    return host


def recorded(name: str):
    path = recording(name)
    host = host_of(path)
    raw = path / "raw" / host
    runs = [load(f) for f in sorted(raw.glob("[0-9][0-9]-*.json"))]
    return path, host, load(raw / "conditions.json"), runs


def config_of(cond: dict):
    """The measured host's config as far as the plans read it: the levels, limits, alpha and the
    speculative config the recording states."""
    workload = {**VALID["workload"], "load_levels": cond["load_levels"],
                "max_concurrency": cond["workload"]["max_concurrency"]}  # fmt: skip
    return config_from_data(
        {
            **VALID,
            "workload": workload,
            "max_num_seqs": cond["limits"]["max_num_seqs"],
            "decision_alpha": cond["decision_alpha"],
            "speculative_config": cond["speculative_config"],
        }  # fmt: skip
    )


def asked(plan) -> list[tuple[str, bool, bool]]:
    return [(s.arm.label, s.warmup, s.same_server) for s in plan]


def ran(runs: list[dict]) -> list[tuple[str, bool, bool]]:
    return [
        (r["specdeploy"]["arm"], r["specdeploy"]["warmup"], not r["specdeploy"]["fresh_server"])
        for r in runs
    ]


def by_level(runs: list[dict]) -> dict[int, dict[str, list[float]]]:
    out: dict[int, dict[str, list[float]]] = {}
    for r in runs:
        if not r["specdeploy"]["warmup"]:
            arm, c = split_label(r["specdeploy"]["arm"])
            out.setdefault(c, {}).setdefault(arm, []).append(r["median_tpot_ms"])
    return out


def rebuilt(path: Path, host: str, kind: str, tmp_path: Path) -> tuple[dict, dict]:
    shutil.copytree(path / "raw" / host, tmp_path / "raw" / host)
    report.write(tmp_path, kind)
    return load(tmp_path / "summary.json")["hosts"][host], load(path / "summary.json")["hosts"][
        host
    ]


def test_the_load_tune_asks_for_exactly_the_recorded_runs():
    path, host, cond, runs = recorded(TUNE)
    assert cond["tune_method"] == "load" and cond["restart_between_samples"].startswith("per visit")
    cfg = config_of(cond)
    plan = LoadTune(cfg, tuple(cond["ks"]), cond["repeats"], cond["warmup_runs"], **handed(cfg))
    assert asked(plan) == ran(runs)
    assert [r["specdeploy"]["index"] for r in runs] == list(range(len(runs)))


def test_the_load_tune_decides_each_level_as_recorded_and_as_its_runs_say(tmp_path):
    path, host, cond, runs = recorded(TUNE)
    h, live = rebuilt(path, host, "tune", tmp_path)
    assert h["decision"] == approx_tree(live["decision"])
    assert h["recommendation"] == approx_tree(live["recommendation"])
    assert h["host_data_change"] == live["host_data_change"]
    levels = by_level(runs)
    each = cond["decision_alpha"] / len(levels)
    assert h["decision"]["level_alpha"] == pytest.approx(each)
    (k,) = cond["ks"]  # the live test tunes one k: a level's choice is its one-sided test
    for c, arms in levels.items():
        p = rank_p_less(arms[f"k{k}"], arms["baseline"])
        assert h["decision"]["best_k"][str(c)] == (k if p <= each else 0), (c, p)
    schedule = h["recommendation"]["schedule"]
    if schedule:  # a candidate runs each level's own k, under vLLM's rules
        assert schedule_problems(schedule, k) == []
        assert {str(c): k_at(schedule, c, k) for c in levels} == h["decision"]["best_k"]


def test_the_proof_asks_for_exactly_the_recorded_runs():
    path, host, cond, runs = recorded(PROOF)
    assert cond["across_load"] is True
    candidate = None if cond["schedule_deployed"] else cond["schedule"]  # compare_schedule
    cfg = config_of(cond)
    proof = LoadProof(
        cfg,
        cond["fixed_k"],
        cond["repeats"],
        cond["warmup_runs"],
        tuple(tuple(e) for e in candidate) if candidate else None,
        **handed(cfg),
    )
    assert [a.label for a in proof.arms()] == cond["arms"]
    assert asked(proof) == ran(runs)
    assert bool(cond["schedule"]) == ("schedule" in cond["arms"])
    if candidate:  # the candidate ran as an arm; the deployed config has no schedule
        assert SCHEDULE_KEY not in cond["speculative_config"]
        (arm,) = [r for r in runs if r["specdeploy"]["arm"].startswith("schedule@")][:1]
        assert arm["specdeploy"]["speculative_config"][SCHEDULE_KEY] == candidate


def test_the_proof_decides_as_recorded_and_as_its_runs_say(tmp_path):
    path, host, cond, runs = recorded(PROOF)
    h, live = rebuilt(path, host, "compare", tmp_path)
    assert h["proof"] == approx_tree(live["proof"])
    levels = by_level(runs)
    each = cond["decision_alpha"] / len(levels)
    deployed = h["deployed"]
    slower = [
        c
        for c, arms in sorted(levels.items())
        if 2 * rank_p_less(arms["baseline"], arms[deployed]) <= each  # two-sided
    ]
    assert h["proof"]["slower_at"] == slower
    if h["proof"]["proven"]:  # never deployed unless seen winning somewhere, losing nowhere
        assert h["proof"]["faster_at"] and not slower
        assert h["proven_range"] == [1, max(levels)]
