"""The H200 load proofs (issue 39, benchmarks/gpu_load) replayed through the product's decision
code: the recorded runs at concurrency 1 / 16 / 64 (vLLM 0.26.0) go through report/load_summary
(decide/load_rule: the k per level, the schedule builder, the schedule proof) and must give the
recorded answer. h200-0.26.0: the baseline, k = 1, k = 3 and the issue's schedule, two fresh
starts per arm (no level can be decided); h200-0.26.0-5starts: the baseline, k = 1 and the
schedule, five fresh starts per arm (the proof's minimum at alpha 0.05 over three levels), where
the product names the levels at which the schedule is slower. A change in the decision code that
changes any verdict fails here."""

import json
from pathlib import Path

import pytest

from specdeploy.decide.load_rule import SCHEDULE_KEY, proof_runs, split_label, tpot_by_level
from specdeploy.decide.stats import DEFAULT_ALPHA
from specdeploy.report.load_summary import load_summary
from tests.unit import REPO

RECORDINGS = REPO / "benchmarks" / "gpu_load"
RECORDING = RECORDINGS / "h200-0.26.0"
FIVE = RECORDINGS / "h200-0.26.0-5starts"
SCHEDULE = [[1, 4, 3], [5, 24, 1], [25, 64, 0]]
LEVELS = [1, 16, 64]
PIECEWISE_OVERRIDE = "Overriding cudagraph_mode from FULL_AND_PIECEWISE to PIECEWISE"


def read(name, recording=RECORDING):
    return json.loads((recording / name).read_text())


def as_json(value):
    """As summary.json keeps it (integer keys written as strings)."""
    return json.loads(json.dumps(value, default=str))


def replay(recording):
    given, recorded = read("inputs.json", recording), read("summary.json", recording)
    head = {"run": recording.name, "kind": "tune", "hosts": {}}
    tune = load_summary({"h200-tune": given["tune"]}, head)
    proof = load_summary({"h200-proof": given["proof"]}, head | {"kind": "compare", "hosts": {}})
    return (
        given,
        recorded,
        as_json(tune)["hosts"]["h200-tune"],
        as_json(proof)["hosts"]["h200-proof"],
    )


@pytest.fixture(scope="module")
def replayed():
    return replay(RECORDING)


@pytest.fixture(scope="module")
def replayed_five():
    return replay(FIVE)


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


@pytest.mark.parametrize("recording", [RECORDING, FIVE], ids=lambda p: p.name)
def test_server_logs_show_piecewise_graphs_only_with_the_schedule(recording):
    for rnd in read("rounds.json", recording):
        for arm, server in rnd["servers"].items():
            overridden = PIECEWISE_OVERRIDE in " ".join(server["graph_lines"])
            assert overridden == (arm == "schedule"), (rnd["round"], arm)


# --- h200-0.26.0-5starts: enough fresh starts for the proof to decide every level ---------------


def test_five_starts_recording_holds_the_proofs_minimum_from_distinct_starts():
    """Every arm at every level has exactly the runs the proof needs at alpha 0.05 over three
    levels (load_rule.proof_runs), one per measured round, each round a fresh server per arm."""
    need = proof_runs(len(LEVELS), DEFAULT_ALPHA)
    by_level = tpot_by_level(read("results.json", FIVE))
    assert sorted(by_level) == LEVELS
    for c in LEVELS:
        assert {arm: len(v) for arm, v in by_level[c].items()} == dict.fromkeys(
            ["baseline", "k1", "schedule"], need
        )
    measured = [r for r in read("rounds.json", FIVE) if r["mode"] != "warmup"]
    assert len(measured) == need
    for rnd in measured:
        labels = sorted(Path(run["file"]).stem for run in rnd["runs"] if "error" not in run)
        assert labels == sorted(f"{arm}@c{c}" for arm in rnd["servers"] for c in LEVELS)


def test_five_starts_servers_sized_their_kv_cache_alone():
    """The runner started a round's servers overlapping (device_run.py); a memory profile that
    saw another server's allocation would show it as its own non-torch memory and a smaller KV
    cache. Every measured start profiled clean, so each arm's KV cache is the same every round."""
    kv: dict[str, set] = {}
    for rnd in read("rounds.json", FIVE):
        if rnd["mode"] == "warmup":
            continue
        for arm, server in rnd["servers"].items():
            assert server["state"] == "ok" and server["clean_profile"], (rnd["round"], arm)
            assert server["memory"]["non_torch"] < 1, (rnd["round"], arm)
            kv.setdefault(arm, set()).add(server["memory"]["kv_cache_gib"])
    assert all(len(sizes) == 1 for sizes in kv.values()), kv


def test_five_starts_tune_is_the_recorded_one_and_k1_loses_under_load(replayed_five):
    _, recorded, tune, _ = replayed_five
    want = recorded["tune"]["hosts"]["h200-tune"]
    assert tune["decision"] == want["decision"]
    assert tune["recommendation"] == want["recommendation"]
    assert tune["decision"]["best_k"] == dict.fromkeys(["1", "16", "64"], 0)
    fixed = tune["recommendation"]["fixed"]
    assert fixed["k"] is None and fixed["loses_at"] == {"1": [16, 64]}
    assert tune["recommendation"]["recommended"] == "off"
    assert tune["host_data_change"] == want["host_data_change"]
    assert "leave speculation off" in tune["host_data_change"]
    assert tune["ratios"] == want["ratios"]


def test_five_starts_proof_names_every_level_where_the_schedule_is_slower(replayed_five):
    """Issue 39's H200 bullet: where the schedule loses the product says so, names the level,
    and recommends the best of fixed k / off instead (here off: k = 1 loses at 16 and 64)."""
    given, recorded, tune, proof = replayed_five
    want = recorded["proof"]["hosts"]["h200-proof"]
    assert given["proof"]["conditions"]["fixed_k"] == 1  # the tune printed none: the config's k
    assert proof["proof"] == want["proof"]
    assert proof["proof"]["slower_at"] == LEVELS
    assert proof["proof"]["behind_fixed_at"] == LEVELS
    assert proof["proof"]["fixed_slower_at"] == [16, 64]
    assert proof["proof"]["decision"] == "off" and not proof["proof"]["proven"]
    assert proof["proof"]["verdict"] == (
        "the schedule is not deployed: significantly slower than the baseline at concurrency "
        "1, 16, 64; leave speculation off (the fixed k loses at 16, 64)"
    )
    assert proof["host_data_change"] == want["host_data_change"]
    assert "leave speculation off" in proof["host_data_change"]
    assert SCHEDULE_KEY not in proof["host_data_change"]
    assert proof["ratios"] == want["ratios"]


def test_five_starts_decide_every_level(replayed_five):
    """Five runs against five: every schedule run is slower than every baseline run at every
    level (two-sided exact p = 2/252, below alpha / 3), so no comparison of the schedule is left
    at 'too few runs'."""
    _, _, _, proof = replayed_five
    by_level = tpot_by_level(read("results.json", FIVE))
    for c in LEVELS:
        assert min(by_level[c]["schedule"]) > max(by_level[c]["baseline"])
        level = proof["proof"]["levels"][str(c)]
        assert level["vs_baseline"]["verdict"] == "worse"
        assert level["vs_baseline"]["p_value"] <= proof["proof"]["level_alpha"]
