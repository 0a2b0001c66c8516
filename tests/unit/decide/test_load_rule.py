"""Load-aware speculation's pure rules (decide/load_rule.py, issue 39), on synthetic per-level runs
shaped like the H200 load sweep (shared/gpu/load-sweep-2026-12-04: baseline 5.18 / 5.51 / 7.40 ms
at concurrency 1 / 16 / 64, k = 1 4.87 / 7.72 / 11.26, the schedule 8.23 / 12.17 / 14.65) and like
the sandbox's CPU engine, and vLLM's own schedule rules (vllm 0.32.0,
v1/spec_decode/dynamic/utils.py)."""

from __future__ import annotations

import pytest

from specdeploy.decide.load_rule import (
    build_schedule,
    crossing_verdict,
    decide_levels,
    fixed_k_over_levels,
    k_at,
    level_alpha,
    prove_schedule,
    ramp_levels,
    schedule_boundaries,
    schedule_config,
    schedule_problems,
    tune_recommendation,
)
from specdeploy.decide.stats import min_runs_per_arm

SPREAD = (0.97, 0.99, 1.0, 1.01, 1.03)  # five fresh-server runs around a median, 3 % apart


def runs(median_ms: float, n: int = 5) -> list[float]:
    return [median_ms * f for f in SPREAD[:n]]


H200 = {  # median TPOT ms by concurrency: baseline (k = 0), k = 1, k = 3
    1: {0: 5.18, 1: 4.87, 3: 6.50},
    16: {0: 5.51, 1: 7.72, 3: 7.27},
    64: {0: 7.40, 1: 11.26, 3: 11.67},
}
CROSSOVER = {  # speculation pays at 1 and 4, k = 3 best at 1, k = 1 at 4, loses at 16
    1: {0: 40.0, 1: 30.0, 3: 20.0},
    4: {0: 50.0, 1: 38.0, 3: 45.0},
    16: {0: 60.0, 1: 75.0, 3: 90.0},
}


def measured(table):
    return {c: {k: runs(v) for k, v in arms.items()} for c, arms in table.items()}


def test_each_level_is_decided_at_its_bonferroni_share_of_alpha():
    d = decide_levels(measured(CROSSOVER), alpha=0.05)
    assert d["level_alpha"] == pytest.approx(0.05 / 3) == level_alpha(0.05, 3)
    assert {c: lv["alpha"] for c, lv in d["levels"].items()} == {1: d["level_alpha"]} | {
        4: d["level_alpha"],
        16: d["level_alpha"],
    }
    assert d["best_k"] == {1: 3, 4: 1, 16: 0}
    assert d["levels"][16]["slower_than_baseline"] == {1: True, 3: True}
    assert "Bonferroni over the levels" in d["rule"]


def test_runs_that_decide_one_level_alone_do_not_decide_it_among_three():
    """4 + 4 runs reach p = 1/70 one-sided: enough for one k at 0.05, not for 2 k at 0.05 / 3
    (Holm's first step 0.0083): the correction across levels costs runs, and says so."""
    four = {c: {k: runs(v, 4) for k, v in arms.items()} for c, arms in CROSSOVER.items()}
    alone = decide_levels({1: four[1]}, alpha=0.05)
    assert alone["best_k"] == {1: 3}
    three = decide_levels(four, alpha=0.05)
    assert three["best_k"] == {1: 0, 4: 0, 16: 0}
    assert not three["levels"][1]["reachable"]["vs_baseline"]
    assert min_runs_per_arm(0.05 / 3 / 2, alternative="less") == 5


def test_the_schedule_follows_the_levels_and_merges_equal_neighbours():
    assert build_schedule({1: 3, 4: 1, 16: 0}, max_num_seqs=16) == [
        [1, 1, 3],
        [2, 4, 1],
        [5, 16, 0],
    ]
    assert build_schedule({1: 3, 4: 3, 16: 0}, max_num_seqs=32) == [[1, 4, 3], [5, 32, 0]]
    assert build_schedule({2: 2, 8: 0}, max_num_seqs=8) == [[1, 2, 2], [3, 8, 0]]
    assert build_schedule({1: 2, 4: 2}, max_num_seqs=8) is None  # one k everywhere: no schedule
    assert build_schedule({1: 0, 4: 0}, max_num_seqs=8) is None


def test_a_built_schedule_passes_vllms_rules_and_runs_each_levels_k():
    best = {1: 3, 4: 1, 16: 0}
    schedule = build_schedule(best, max_num_seqs=16)
    config = schedule_config({"method": "draft_model", "num_speculative_tokens": 1}, schedule)
    assert config["num_speculative_tokens"] == 3  # vLLM caps every k at it: nothing capped
    assert schedule_problems(schedule, config["num_speculative_tokens"]) == []
    assert {c: k_at(schedule, c, 3) for c in best} == best


@pytest.mark.parametrize(
    ("schedule", "fragment"),
    [
        ([], "non-empty list"),
        ([[2, 4, 1]], "must start at batch size 1"),
        ([[1, 4, 3], [3, 8, 1]], "sorted and non-overlapping"),
        ([[1, 4, 3], [5, 3, 1]], "1 <= start <= end"),
        ([[0, 4, 3]], "1 <= start <= end"),
        ([[1, 4, -1]], "k must be >= 0"),
        ([[5, 8, 1], [1, 4, 3]], ""),  # vLLM sorts the ranges itself: not refused
        ([[1, 4, 5]], "above num_speculative_tokens 3"),
        ([[1, 4]], "three integers"),
        ("[[1,4,3]]", "non-empty list"),
    ],
)
def test_schedule_rules_are_vllms(schedule, fragment):
    problems = schedule_problems(schedule, 3)
    assert any(fragment in p for p in problems) if fragment else not problems, problems


def test_k_at_carries_a_gap_and_the_tail_like_vllms_lookup():
    schedule = [[1, 16, 3], [32, 128, 2]]  # vLLM's own docstring example: 17-31 run k = 3
    assert [k_at(schedule, b, 4) for b in (1, 16, 17, 31, 32, 200)] == [3, 3, 3, 3, 2, 2]
    assert k_at(schedule, 1, 2) == 2  # capped at num_speculative_tokens


def test_h200_k1_pays_at_low_load_only_so_no_fixed_k_is_safe():
    d = decide_levels(measured(H200), alpha=0.05)
    assert d["best_k"] == {1: 1, 16: 0, 64: 0}
    fixed = fixed_k_over_levels(d)
    assert fixed["k"] is None
    assert fixed["pays_at"][1] == [1] and fixed["loses_at"][1] == [16, 64]
    assert "k = 1 pays at 1 but loses at 16, 64" in fixed["verdict"]
    rec = tune_recommendation(d, max_num_seqs=64, schedule_supported=True)
    assert rec["schedule"] == [[1, 1, 1], [2, 64, 0]] and rec["recommended"] == "schedule candidate"
    assert "to be proven" in rec["verdict"]


def test_no_candidate_schedule_without_the_key_or_with_data_parallelism():
    d = decide_levels(measured(CROSSOVER), alpha=0.05)
    old = tune_recommendation(d, max_num_seqs=16, schedule_supported=False)
    assert old["schedule"] is None and "no num_speculative_tokens_per_batch_size" in old["verdict"]
    dp = tune_recommendation(d, max_num_seqs=16, schedule_supported=True, data_parallel_size=2)
    assert dp["schedule"] is None and "data parallelism > 1" in dp["verdict"]
    assert old["recommended"] == dp["recommended"] == "off"  # both k lose at 16
    assert "k = 1 pays at 1, 4 but loses at 16" in old["verdict"]


def test_a_fixed_k_that_never_loses_is_the_fallback():
    table = {1: {0: 40.0, 2: 25.0}, 8: {0: 50.0, 2: 49.5}}  # pays at 1, a tie at 8
    d = decide_levels(measured(table), alpha=0.05)
    fixed = fixed_k_over_levels(d)
    assert fixed["k"] == 2 and fixed["faster_at"] == [1] and fixed["loses_at"][2] == []
    rec = tune_recommendation(d, max_num_seqs=8, schedule_supported=False)
    assert rec["schedule"] is None and rec["recommended"] == "k"
    assert rec["verdict"].startswith("k = 2: faster than the baseline at concurrency 1")
    # with the key: off at 8 (a tie) is a candidate, k = 2 what runs until it is proven
    rec = tune_recommendation(d, max_num_seqs=8, schedule_supported=True)
    assert rec["schedule"] == [[1, 1, 2], [2, 8, 0]] and "until then: k = 2" in rec["verdict"]


def test_the_h200_schedule_that_lost_everywhere_is_never_deployed():
    proof = {
        1: {"baseline": runs(5.18), "schedule": runs(8.23), "fixed": runs(4.87)},
        16: {"baseline": runs(5.51), "schedule": runs(12.17), "fixed": runs(7.72)},
        64: {"baseline": runs(7.40), "schedule": runs(14.65), "fixed": runs(11.26)},
    }
    p = prove_schedule(proof, alpha=0.05)
    assert not p["proven"] and p["slower_at"] == [1, 16, 64]
    assert p["decision"] == "off" and not p["fixed_proven"]
    assert "slower than the baseline at concurrency 1, 16, 64" in p["verdict"]
    assert "the fixed k loses at 16, 64" in p["verdict"]


def test_a_schedule_that_wins_low_and_ties_high_is_proven():
    proof = {
        1: {"baseline": runs(40.0), "schedule": runs(20.0), "fixed": runs(20.5)},
        4: {"baseline": runs(50.0), "schedule": runs(38.0), "fixed": runs(45.0)},
        16: {"baseline": runs(60.0), "schedule": runs(60.3), "fixed": runs(90.0)},
    }
    p = prove_schedule(proof, alpha=0.05)
    assert p["proven"] and p["decision"] == "schedule", p["verdict"]
    assert p["faster_at"] == [1, 4] and p["slower_at"] == [] and p["behind_fixed_at"] == []


def test_a_schedule_behind_the_fixed_k_falls_back_to_it():
    proof = {
        1: {"baseline": runs(40.0), "schedule": runs(30.0), "fixed": runs(20.0)},
        4: {"baseline": runs(50.0), "schedule": runs(40.0), "fixed": runs(40.0)},
    }
    p = prove_schedule(proof, alpha=0.05)
    assert not p["proven"] and p["behind_fixed_at"] == [1]
    assert p["decision"] == "fixed" and "the fixed k instead" in p["verdict"]


# --- refused before any host is touched (checks/load.py) ------------------------------------------


def problems_of(data) -> dict[str, str]:
    from specdeploy.checks.host_data import check_host

    return {p.field: str(p) for p in check_host("gpu-1", data)}


def test_load_levels_default_to_a_spread_and_read_short_forms(valid_data):
    from specdeploy.config.schema import config_from_data

    workload = config_from_data(valid_data).workload
    assert [lv.concurrency for lv in workload.effective_load_levels] == [1, 2, 4]
    valid_data["workload"] |= {"load_levels": "4,1"}
    levels = config_from_data(valid_data).workload.load_levels
    assert [lv.concurrency for lv in levels] == [1, 4]  # sorted
    at = config_from_data(valid_data).workload.at_level(levels[1])
    assert (at.max_concurrency, at.request_rate, at.num_prompts) == (4, float("inf"), 16)
    assert problems_of(valid_data) == {}


def test_a_load_level_above_max_num_seqs_is_refused(valid_data):
    valid_data["workload"] |= {"load_levels": [1, 4, 16]}
    found = problems_of(valid_data)
    assert found == {
        "workload.load_levels[2].concurrency": "gpu-1: workload.load_levels[2].concurrency: 16 "
        "is above max_num_seqs 4: the server never runs a batch that large, so that level would "
        "measure a queue — lower it to at most 4, or raise max_num_seqs"
    }
    valid_data["max_num_seqs"] = 16
    assert problems_of(valid_data) == {}


def test_a_repeated_load_level_is_refused(valid_data):
    valid_data["workload"] |= {"load_levels": [4, 4]}
    assert "each concurrency once" in problems_of(valid_data)["workload.load_levels"]


def test_a_schedule_vllm_would_refuse_is_refused_and_one_it_clamps_warned_of(valid_data):
    field = "speculative_config.num_speculative_tokens_per_batch_size"
    valid_data["speculative_config"] |= {field.split(".")[1]: [[2, 4, 3], [5, 8, 9]]}
    found = problems_of(valid_data)
    assert list(found) == [field]  # the pinned release's own rules (checks/release.py)
    assert "refuses it unless the first range starts at 1" in found[field]
    valid_data["speculative_config"][field.split(".")[1]] = [[1, 4, 3], [5, 8, 9]]
    assert problems_of(valid_data) == {}
    from specdeploy.checks.host_data import check_warnings

    clamped = [w.what for w in check_warnings("h1", valid_data) if w.field == field]
    assert any("exceeds num_speculative_tokens 5" in w for w in clamped), clamped
    valid_data["speculative_config"][field.split(".")[1]] = [[1, 4, 3], [5, 8, 0]]
    assert problems_of(valid_data) == {}


def test_a_schedule_with_data_parallelism_is_refused(valid_data):
    key = "num_speculative_tokens_per_batch_size"
    valid_data["speculative_config"] |= {key: [[1, 4, 3], [5, 8, 0]]}
    valid_data["vllm_extra_args"] = ["--data-parallel-size", "2"]
    found = problems_of(valid_data)
    assert (
        "drops the schedule silently with data parallelism > 1"
        in found[f"speculative_config.{key}"]
    )


# --- the proven range: status and the Prometheus alert ---------------------------------------


def scheduled(valid_data, levels=(1, 2, 4)):
    from specdeploy.config.schema import config_from_data

    key = "num_speculative_tokens_per_batch_size"
    data = {**valid_data, "max_num_seqs": 8}
    data["speculative_config"] = {**valid_data["speculative_config"], key: [[1, 2, 5], [3, 8, 0]]}
    data["workload"] = {**valid_data["workload"], "load_levels": list(levels)}
    return config_from_data(data)


def test_the_proven_range_is_the_proofs_levels_and_nothing_else_proves_one():
    from specdeploy.decide.load_rule import batch_outside_proven, proof_range

    proof = {"proven": True, "key": "k", "levels": {"1": {}, "2": {}, "4": {}}}
    proven = proof_range(proof)
    assert proven == (1, 4)
    assert batch_outside_proven(proven, 4.0) is None
    assert batch_outside_proven(proven, 6.0) == (
        "running batch 6 is outside the schedule's proven range 1-4 (its proof's load levels): "
        "add the level and prove it (compare_across_load)"
    )
    # no proof, a lost proof, an allowance, a proof matched before fingerprints: no range
    for nothing in (None, {**proof, "proven": False}, {"proven": False, "allowed_unproven": True},
                    {k: v for k, v in proof.items() if k != "key"}):  # fmt: skip
        assert proof_range(nothing) is None and batch_outside_proven(None, 99.0) is None


def test_render_calls_a_schedule_without_a_kept_proof_unproven(tmp_path, valid_data):
    """No proof under the reports: the scheduled host gets no proven range (on main: its load
    levels, with no proof at all), it is recorded as unproven; a host without a schedule keeps
    max_num_seqs."""
    import yaml

    from specdeploy.observe.monitoring import write_prometheus

    plain = config_from_data_open({**valid_data, "vllm_host": "0.0.0.0"})
    with_schedule = scheduled({**valid_data, "vllm_host": "0.0.0.0"})
    hosts = [("a", [], {}, with_schedule), ("b", [], {}, plain)]
    write_prometheus(tmp_path, hosts, reports=tmp_path / "reports", warn=print)
    groups = yaml.safe_load((tmp_path / "baselines.yml").read_text())["groups"]
    assert [g["name"] for g in groups] == ["specdeploy-baselines", "specdeploy-schedules"]
    proven = groups[1]["rules"]
    # b has no schedule: its max_num_seqs, which no batch exceeds (the alert has data, stays quiet)
    assert proven == [
        {
            "record": "specdeploy:proven_batch_size_max",
            "expr": "vector(4)",
            "labels": {"host": "b"},
        },
        {"record": "specdeploy:schedule_unproven", "expr": "vector(1)", "labels": {"host": "a"}},
        {"record": "specdeploy:schedule_unproven", "expr": "vector(0)", "labels": {"host": "b"}},
    ]
    assert plain.effective_max_num_seqs == 4


def config_from_data_open(data):
    from specdeploy.config.schema import config_from_data

    return config_from_data(data)


@pytest.mark.needs_tool("promtool")
def test_the_alert_fires_when_the_running_batch_leaves_the_proven_range(tmp_path):
    """A host whose servers ran 6 requests at once for 10 minutes, proven up to 4, alerts; one
    running 3 does not, and a host with no schedule (its constant: max_num_seqs) does not."""
    from tests.unit.observe.test_monitoring import fired, promtool_test

    def running(host, values):
        labels = f'job="specdeploy-vllm",instance="{host}:8000",host="{host}",engine="0"'
        return {"series": f"vllm:num_requests_running{{{labels}}}", "values": values}

    inputs = [
        running("busy", "6x30"),
        running("calm", "3x30"),
        running("plain", "16x30"),
        {"series": 'specdeploy:proven_batch_size_max{host="busy"}', "values": "4x30"},
        {"series": 'specdeploy:proven_batch_size_max{host="calm"}', "values": "4x30"},
        {"series": 'specdeploy:proven_batch_size_max{host="plain"}', "values": "16x30"},
    ]
    alert = "SpeculationBatchOutsideProvenRange"
    notes = {
        "summary": "busy: batches larger than its speculation schedule was proven at",
        "description": "Up to 6 requests ran at once; the schedule "
        "(num_speculative_tokens_per_batch_size) was measured winning only up to the highest "
        "load level of its proof, and speculation can lose at a larger batch. Add that level and "
        "prove it with deploys/compare.py (compare_across_load).",
    }
    promtool_test(
        tmp_path,
        inputs,
        [fired(alert, "5m"), fired(alert, "20m", ({"host": "busy", "severity": "warning"}, notes))],
    )


def test_a_workload_without_load_levels_dumps_as_before(valid_data):
    """The gate's fingerprint and every record hold workload.model_dump(): a host that sets no
    load_levels must not look changed (and be re-gated) after an upgrade."""
    from specdeploy.config.schema import config_from_data

    dumped = config_from_data(valid_data).workload.model_dump()
    assert "load_levels" not in dumped and set(dumped) >= set(valid_data["workload"])
    valid_data["workload"] |= {"load_levels": [1, 4]}
    levels = config_from_data(valid_data).workload.model_dump()["load_levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 4]


def test_a_candidate_schedule_is_read_from_json_text_and_checked(valid_data):
    from specdeploy.config.schema import config_from_data

    text = "[[1, 2, 3], [3, 4, 0]]"  # as SPECDEPLOY_COMPARE_SCHEDULE carries it
    assert config_from_data({**valid_data, "compare_schedule": text}).compare_schedule == [
        [1, 2, 3],
        [3, 4, 0],
    ]
    found = problems_of({**valid_data, "compare_schedule": [[2, 4, 3]]})
    assert (
        list(found) == ["compare_schedule"]
        and "must start at batch size 1" in found["compare_schedule"]
    )


# --- the threshold-crossing collapse (vllm#49548): the ramp and its verdict -----------------------


def test_boundaries_are_where_k_changes_and_agree_with_vllms_lookup():
    schedule = [[1, 2, 3], [3, 4, 3], [5, 8, 1], [12, 16, 0]]  # a gap 9-11 carries k = 1
    found = schedule_boundaries(schedule)
    assert found == [{"at": 4, "below": 3, "above": 1}, {"at": 11, "below": 1, "above": 0}]
    for b in found:  # each boundary is exactly where vLLM's lookup switches k
        assert (
            k_at(schedule, b["at"], 3) == b["below"]
            and k_at(schedule, b["at"] + 1, 3) == b["above"]
        )
    assert schedule_boundaries([[1, 8, 2]]) == []


def test_the_ramp_straddles_the_boundary_within_max_num_seqs():
    assert ramp_levels(2, width=2, max_num_seqs=4) == [1, 2, 3, 4]
    assert ramp_levels(1, width=2, max_num_seqs=4) == [1, 2, 3]
    assert ramp_levels(4, width=2, max_num_seqs=5) == [3, 4, 5]


def ramp(table: dict) -> dict:
    """{c: (schedule, below, above) median tokens/s} -> runs."""
    return {c: {"schedule": runs(s), "below": runs(b), "above": runs(a)}
            for c, (s, b, a) in table.items()}  # fmt: skip


def test_a_schedule_that_follows_its_neighbours_does_not_collapse():
    # k = 3 pays at 1-2, off (the baseline) pays above: the schedule matches whichever it runs
    r = crossing_verdict(
        ramp({1: (30, 30, 20), 2: (50, 50, 40), 3: (60, 55, 60), 4: (70, 60, 70)}), boundary=2
    )
    assert r["collapsed_at"] == [] and r["behind_own_at"] == [] and "no collapse" in r["verdict"]
    assert [r["levels"][c]["runs_as"] for c in (1, 2, 3, 4)] == ["below", "below", "above", "above"]


def test_a_collapse_past_the_threshold_is_named():
    # past the boundary the schedule falls below both fixed configs (vllm#49548's report)
    r = crossing_verdict(
        ramp({1: (30, 30, 20), 2: (50, 50, 40), 3: (35, 55, 60), 4: (40, 60, 70)}), boundary=2
    )
    assert r["collapsed_at"] == [3, 4] and r["behind_own_at"] == [3, 4]
    assert r["verdict"].startswith("collapse") and "concurrency 3, 4" in r["verdict"]
    assert r["levels"][3]["vs_above"]["verdict"] == "worse"


def test_below_its_own_config_but_not_both_is_no_collapse_yet_is_said():
    r = crossing_verdict(ramp({1: (25, 30, 20), 2: (50, 50, 40)}), boundary=2)
    assert r["collapsed_at"] == [] and r["behind_own_at"] == [1]
    assert "below the config it runs at concurrency 1" in r["verdict"]
