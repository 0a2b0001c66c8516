"""The H200 load proof (issue 39, benchmarks/gpu_load/h200-0.26.0) replayed through the product's
decision code: the recorded runs of the baseline, k = 1, k = 3 and the issue's schedule at
concurrency 1 / 16 / 64 (vLLM 0.26.0, two fresh starts per arm) go through report/load_summary
(decide/load_rule: the k per level, the schedule builder, the schedule proof) and must give the
recorded answer. A change in the decision code that changes any verdict fails here."""

import json
from pathlib import Path

import pytest

from specdeploy.decide.load_rule import SCHEDULE_KEY, split_label, tpot_by_level
from specdeploy.report.load_summary import load_summary

RECORDING = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_load" / "h200-0.26.0"
SCHEDULE = [[1, 4, 3], [5, 24, 1], [25, 64, 0]]
LEVELS = [1, 16, 64]


def read(name):
    return json.loads((RECORDING / name).read_text())


def as_json(value):
    """As summary.json keeps it (integer keys written as strings)."""
    return json.loads(json.dumps(value, default=str))


@pytest.fixture(scope="module")
def replayed():
    given, recorded = read("inputs.json"), read("summary.json")
    head = {"run": "h200-0.26.0", "kind": "tune", "hosts": {}}
    tune = load_summary({"h200-tune": given["tune"]}, head)
    proof = load_summary({"h200-proof": given["proof"]}, head | {"kind": "compare", "hosts": {}})
    return (
        given,
        recorded,
        as_json(tune)["hosts"]["h200-tune"],
        as_json(proof)["hosts"]["h200-proof"],
    )


def test_recording_holds_two_fresh_starts_per_arm_and_level():
    runs = read("results.json")
    by_level = tpot_by_level(runs)
    assert sorted(by_level) == LEVELS
    for c in LEVELS:
        assert {arm: len(v) for arm, v in by_level[c].items()} == dict.fromkeys(
            ["baseline", "k1", "k3", "schedule"], 2
        )
    # every run's own label and arm config, as measure/load_flow labels and harness records them
    for r in runs:
        arm, _ = split_label(r["specdeploy"]["arm"])
        spec = r["specdeploy"]["speculative_config"]
        assert (spec is None) == (arm == "baseline")
        assert (spec or {}).get(SCHEDULE_KEY) == (SCHEDULE if arm == "schedule" else None)


def test_tune_decision_is_the_recorded_one(replayed):
    _, recorded, tune, _ = replayed
    want = recorded["tune"]["hosts"]["h200-tune"]
    assert (
        tune["decision"]["best_k"]
        == want["decision"]["best_k"]
        == dict.fromkeys(["1", "16", "64"], 0)
    )
    assert tune["recommendation"] == want["recommendation"]
    assert tune["recommendation"]["recommended"] == "off"
    assert tune["host_data_change"] == want["host_data_change"]
    assert tune["ratios"] == want["ratios"]


def test_schedule_is_not_deployed_and_the_product_says_why(replayed):
    given, recorded, tune, proof = replayed
    want = recorded["proof"]["hosts"]["h200-proof"]
    # the proof's fixed arm is the k the tune printed (none: the config's k = 3)
    assert given["proof"]["conditions"]["fixed_k"] == (tune["recommendation"]["fixed"]["k"] or 3)
    assert proof["proof"] == want["proof"]
    assert proof["proof"]["decision"] == "off" and not proof["proof"]["proven"]
    assert proof["proof"]["verdict"] == (
        "the schedule is not deployed: not shown faster than the baseline at any level; "
        "leave speculation off"
    )
    assert proof["host_data_change"] == want["host_data_change"]
    assert "leave speculation off" in proof["host_data_change"]
    assert SCHEDULE_KEY not in (proof["host_data_change"] or "")


def test_two_starts_per_arm_cannot_decide_a_level(replayed):
    """Two runs against two: the exact two-sided rank test's smallest p is 1/3, above any level's
    alpha, so every comparison is 'too few runs' however far apart the arms are (here the
    schedule's every run is slower than every baseline run at every level)."""
    _, _, _, proof = replayed
    by_level = tpot_by_level(read("results.json"))
    for c in LEVELS:
        assert min(by_level[c]["schedule"]) > max(by_level[c]["baseline"])
        verdicts = {k: v["verdict"] for k, v in proof["proof"]["levels"][str(c)].items()}
        assert set(verdicts.values()) == {"too few runs to decide at alpha"}


def test_server_logs_show_piecewise_graphs_only_with_the_schedule():
    for rnd in read("rounds.json"):
        for arm, server in rnd["servers"].items():
            lines = " ".join(server["graph_lines"])
            overridden = "Overriding cudagraph_mode from FULL_AND_PIECEWISE to PIECEWISE" in lines
            assert overridden == (arm == "schedule"), (rnd["round"], arm)
