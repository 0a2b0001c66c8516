"""decisions.py on fixed inputs: arm summaries, the decision rule on run-level values (p, interval,
verdict), k choice, the speculation gate."""

import pytest

from specdeploy.decide.choose import choose_k, min_runs_for_choose_k
from specdeploy.decide.decisions import (
    acceptance_summary,
    arm_summary,
    compare_arms,
    compare_values,
    host_data_change,
    per_request_tpot_ms,
)
from specdeploy.decide.gate_rule import gate_decision


def run(tpot, ttft=20.0, itl=None, e2el=None, thr=100.0):
    return {
        "median_tpot_ms": tpot,
        "median_ttft_ms": ttft,
        "median_itl_ms": itl if itl is not None else tpot,
        "median_e2el_ms": e2el if e2el is not None else ttft + 31 * tpot,
        "output_throughput": thr,
        "request_throughput": thr / 32,
    }


def test_arm_summary_median_and_mad_per_metric():
    s = arm_summary([run(10.0, thr=90), run(12.0, thr=100), run(11.0, thr=120)])
    assert s["tpot"] == {"n": 3, "median": 11.0, "mad": 1.0, "values": [10.0, 12.0, 11.0]}
    assert s["output_throughput"]["median"] == 100.0 and s["output_throughput"]["mad"] == 10.0


def test_speculation_faster_is_better_with_p_interval_and_runs():
    spec = [run(5.0), run(5.2), run(5.1), run(5.05)]
    base = [run(10.0), run(10.4), run(10.2), run(10.1)]
    r = compare_arms(spec, base)["tpot"]
    assert r["ratio"] == pytest.approx(5.075 / 10.15)
    assert r["p_value"] == pytest.approx(2 / 70) and r["alpha"] == 0.05
    assert r["runs"] == {"speculative": 4, "baseline": 4}
    # 4 + 4 runs: the 1 - 2/70 interval is the range of the 16 pairwise run ratios
    assert r["low"] == pytest.approx(5.0 / 10.4) and r["high"] == pytest.approx(5.2 / 10.0)
    assert r["confidence"] == pytest.approx(1 - 2 / 70)
    assert "rank-test inversion" in r["interval_method"]
    assert r["significant"] and r["verdict"] == "better"
    assert "p = 0.0286 <= alpha = 0.05" in r["reason"] and "4 + 4 runs" in r["reason"]


def test_speculation_slower_is_worse():
    spec = [run(12.0), run(12.5), run(11.8), run(12.2)]
    base = [run(2.0), run(2.1), run(1.9), run(2.05)]
    r = compare_arms(spec, base)["tpot"]
    assert r["ratio"] == pytest.approx(12.1 / 2.025)
    assert r["low"] > 1 and r["verdict"] == "worse"
    assert compare_arms(spec, base)["output_throughput"]["verdict"] == "no significant difference"


def test_overlapping_runs_are_no_significant_difference():
    r = compare_values([9.0, 10.0, 11.0, 10.2], [9.5, 10.5, 11.5, 9.8])
    assert r["verdict"] == "no significant difference" and not r["significant"]
    assert r["p_value"] > 0.05 and r["low"] < 1 < r["high"]


def test_throughput_higher_is_better():
    r = compare_values(
        [200.0, 210.0, 205.0, 201.0], [100.0, 101.0, 99.0, 98.0], lower_is_better=False
    )
    assert r["verdict"] == "better"


def test_three_runs_per_arm_cannot_decide_at_005():
    # every speculative run is twice as fast, yet 3 + 3 runs have only 20 splits: p >= 2/20
    r = compare_values([5.0, 5.1, 5.2], [10.0, 10.1, 10.2])
    assert r["verdict"] == "too few runs to decide at alpha" and not r["significant"]
    assert r["p_value"] == pytest.approx(0.1) and r["min_p_value"] == pytest.approx(0.1)
    assert "p = 0.1 > alpha = 0.05" in r["reason"] and "at least 4 runs per arm" in r["reason"]
    # the widest interval 3 + 3 runs give is reported with its own confidence (90 %)
    assert r["confidence"] == pytest.approx(0.9) and r["low"] == pytest.approx(5.0 / 10.2)
    assert "too few runs for 95.0%" in r["interval_method"]
    # at alpha = 0.1 the same runs decide
    assert compare_values([5.0, 5.1, 5.2], [10.0, 10.1, 10.2], alpha=0.1)["verdict"] == "better"


def test_identical_values_are_no_difference():
    r = compare_values([2.0] * 4, [2.0] * 4)
    assert r["verdict"] == "no significant difference" and r["p_value"] == 1.0
    assert r["ratio"] == 1.0 and r["low"] == 1.0 and r["high"] == 1.0


def test_zero_baseline_is_not_comparable_and_inf_is_not_written():
    zero = compare_values([1.0], [0.0])
    assert zero["verdict"] == "not comparable" and zero["why"] == "baseline median is 0.0"
    empty = compare_values([], [1.0])
    assert empty["verdict"] == "not comparable" and empty["why"] == "no samples"
    assert empty["ratio"] is None and empty["significant"] is False
    r = compare_values([1.0, 2.0, 3.0], [0.0, 1.0, 2.0])  # baseline MAD == median: band edge is inf
    assert r["high"] is None  # inf band edge is JSON-safe None


def test_single_run_gets_no_verdict():
    r = compare_values([5.0], [10.0])
    assert r["ratio"] == 0.5 and r["verdict"] == "too few runs to decide at alpha"
    assert not r["significant"]


def test_acceptance_is_pooled_over_runs():
    a = acceptance_summary(
        [
            {
                "drafts": 10,
                "draft_tokens": 30,
                "accepted_tokens": 15,
                "acceptance_rate": 0.5,
                "mean_acceptance_length": 2.5,
            },
            {
                "drafts": 10,
                "draft_tokens": 30,
                "accepted_tokens": 0,
                "acceptance_rate": 0.0,
                "mean_acceptance_length": 1.0,
            },
        ]
    )
    assert a["acceptance_rate"] == pytest.approx(15 / 60)
    assert a["mean_acceptance_length"] == pytest.approx(1 + 15 / 20)
    assert a["per_run_acceptance_rate"]["median"] == pytest.approx(0.25)


def test_choose_k_smallest_not_significantly_slower_than_the_best():
    tpot = {
        1: [10.0, 10.2, 10.1, 10.3, 10.15],
        2: [8.1, 8.3, 8.2, 8.25, 8.05],
        3: [8.0, 8.2, 7.9, 8.1, 8.15],
        4: [8.4, 8.0, 8.1, 8.3, 8.2],
        5: [9.0, 9.2, 9.1, 9.3, 9.15],
    }
    c = choose_k(tpot)
    assert c["best_k"] == 3 and c["levels"]["vs_best"] == pytest.approx(0.05 / 4)
    assert c["per_k"][1]["slower_than_best"] and c["per_k"][5]["slower_than_best"]
    assert c["per_k"][1]["p_slower_than_best"] == pytest.approx(1 / 252)
    assert not c["per_k"][2]["slower_than_best"] and c["per_k"][2]["within_noise_of_best"]
    assert c["recommended_k"] == 2 and c["speculation"] == "not measured"
    assert "no baseline arm" in c["verdict"]


def test_choose_k_with_a_baseline_recommends_off_when_no_k_beats_it():
    tpot = {1: [10.5, 10.6, 10.4, 10.7, 10.55], 2: [11.0, 11.2, 11.1, 11.3, 11.05]}
    c = choose_k(tpot, baseline=[10.0, 10.1, 9.9, 10.2, 10.05])
    assert c["recommended_k"] is None and c["speculation"] == "off"
    assert c["verdict"].startswith("leave speculation off: no k is significantly faster")
    assert c["per_k"][1]["ratio_to_baseline"] == pytest.approx(10.55 / 10.05)


def test_choose_k_baseline_as_k0_and_on_when_a_k_beats_it():
    tpot = {
        0: [10.0, 10.1, 9.9, 10.2, 10.05],
        1: [8.0, 8.1, 8.05, 8.2, 7.95],
        2: [7.0, 7.1, 7.05, 7.2, 6.95],
        3: [7.02, 7.12, 7.0, 7.15, 7.08],
    }
    c = choose_k(tpot)
    assert c["speculation"] == "on" and c["best_k"] == 2 and c["recommended_k"] == 2
    assert c["baseline"]["n"] == 5 and 0 not in c["per_k"]
    assert all(v["faster_than_baseline"] for v in c["per_k"].values())
    assert c["per_k"][1]["slower_than_best"] and not c["per_k"][3]["slower_than_best"]
    assert "significantly faster than the baseline" in c["verdict"]


def test_choose_k_too_few_runs_leaves_speculation_off_and_says_why():
    c = choose_k({1: [5.0, 5.1, 5.2], 2: [4.0, 4.1, 4.2]}, baseline=[10.0, 10.1, 10.2])
    assert c["recommended_k"] is None and c["reachable"]["vs_baseline"] is False
    assert "too few runs to decide at alpha" in c["verdict"]


def test_choose_k_single_runs_recommend_the_smallest_k():
    # one run per k is no evidence that a larger k is faster: the designed answer is the smallest
    c = choose_k({1: [5.0], 2: [4.0], 3: [4.5]})
    assert c["best_k"] == 2 and c["recommended_k"] == 1 and c["reachable"]["vs_best"] is False


def test_choose_k_ties_prefer_smaller_k():
    assert choose_k({3: [4.0], 2: [4.0]})["best_k"] == 2


def test_choose_k_when_speculation_only_gets_slower_with_k():
    c = choose_k({1: [3.0, 3.1, 2.9], 2: [4.0, 4.1, 3.9], 3: [6.0, 6.2, 5.8]})
    assert c["recommended_k"] == 1


def test_min_runs_for_choose_k():
    assert min_runs_for_choose_k(3) == 4  # tune_flow's confirm window: 1/70 <= 0.05/3
    assert min_runs_for_choose_k(7) == 5  # the 7-k sweep: 1/252 <= 0.05/7 < 1/70


def test_host_data_change_only_changes_k():
    line = host_data_change(
        "h1", {"method": "draft_model", "model": "d", "num_speculative_tokens": 5}, 2
    )
    assert (
        "'num_speculative_tokens': 2" in line
        and "'model': 'd'" in line
        and line.startswith("host_data/h1")
    )


def test_per_request_tpot_from_detailed_result():
    result = {"latencies": [1.0, 0.5, 0.2], "ttfts": [0.1, 0.1, 0.2], "output_lens": [31, 1, 11]}
    assert per_request_tpot_ms(result) == pytest.approx([30.0, 0.0])


def test_gate_passes_when_speculation_beats_the_margin():
    g = gate_decision([5.0, 5.1, 4.9], [10.0, 10.2, 9.8], max_tpot_ratio=0.95, on_fail="baseline")
    assert g["passed"] and g["conclusive"] and g["action"] == "keep speculative"
    assert g["verdict"] == "faster than the margin"
    assert g["ratio"] == pytest.approx(0.5) and g["p_value"] == pytest.approx(1 / 20)
    assert g["high"] == pytest.approx(5.1 / 9.8)  # one-sided 95 % upper bound: largest pair ratio
    assert g["runs"] == {"speculative": 3, "baseline": 3} and g["alpha"] == 0.05
    assert "0.500" in g["reason"] and "<= 0.95" in g["reason"] and "3 + 3" in g["reason"]


def test_gate_fails_conclusively_when_speculation_is_slower():
    g = gate_decision([11.0, 11.5, 10.8], [2.0, 2.1, 1.9], max_tpot_ratio=0.95, on_fail="baseline")
    assert not g["passed"] and g["action"] == "switch to baseline"
    assert g["ratio"] == pytest.approx(5.5) and g["conclusive"]
    assert g["verdict"] == "slower than the margin" and g["p_value_slower"] == pytest.approx(0.05)
    g = gate_decision([11.0, 11.2], [2.0, 2.1], max_tpot_ratio=0.95, on_fail="fail")
    assert g["action"] == "fail the deploy"


def test_gate_needs_two_runs_per_arm_and_says_when_two_cannot_pass():
    with pytest.raises(ValueError, match="at least 2 fresh-server runs"):
        gate_decision([11.0], [2.0], max_tpot_ratio=0.95, on_fail="fail")
    g = gate_decision([5.0, 5.1], [10.0, 10.1], max_tpot_ratio=0.95, on_fail="baseline")
    assert not g["passed"] and g["verdict"] == "too few runs to decide at alpha"
    assert g["min_p_value"] == pytest.approx(1 / 6) and "no data could pass" in g["reason"]


def test_gate_fails_when_faster_but_not_by_the_margin():
    g = gate_decision(
        [9.7, 9.8, 9.9, 9.75], [10.0, 10.1, 9.9, 10.05], max_tpot_ratio=0.95, on_fail="baseline"
    )
    assert not g["passed"]  # 0.97 > 0.95: faster, but not by the required margin


def test_gate_not_shown_faster_when_runs_straddle_the_threshold():
    g = gate_decision([8.0, 9.5, 11.0], [10.0, 10.0, 10.0], max_tpot_ratio=0.97, on_fail="baseline")
    assert not g["passed"] and not g["conclusive"]
    assert g["verdict"] == "not shown faster than the margin"
    assert g["action"] == "switch to baseline"


def test_zero_run_values_keep_an_interval_callers_can_draw():
    # a run whose ITL median is 0 (coalesced chunks): the ratio interval stays defined
    r = compare_values([0.0, 0.1, 0.2, 0.1], [1.0, 1.1, 1.2, 1.05])
    assert r["verdict"] == "better" and r["low"] == 0.0 and r["high"] == pytest.approx(0.2)
    r = compare_values([1.0, 1.1, 1.2, 1.05], [0.0, 1.0, 1.1, 1.2])  # baseline run at 0
    assert r["low"] == 0.0 and r["high"] is None and "unbounded" in r["interval_method"]
