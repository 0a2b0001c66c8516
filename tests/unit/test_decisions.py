"""decisions.py on fixed inputs: arm summaries, ratios with a noise band, k choice, the speculation
gate."""

import pytest

from specdeploy.measure.decisions import (
    acceptance_summary,
    arm_summary,
    choose_k,
    compare_arms,
    compare_values,
    gate_decision,
    host_data_change,
    per_request_tpot_ms,
)


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


def test_speculation_faster_is_better_and_significant():
    spec = [run(5.0), run(5.2), run(5.1)]
    base = [run(10.0), run(10.4), run(10.2)]
    r = compare_arms(spec, base)["tpot"]
    assert r["ratio"] == pytest.approx(5.1 / 10.2)
    assert r["low"] == pytest.approx(5.0 / 10.4) and r["high"] == pytest.approx(5.2 / 10.0)
    assert r["significant"] and r["verdict"] == "better"


def test_speculation_slower_is_worse():
    spec = [run(12.0), run(12.5), run(11.8)]
    base = [run(2.0), run(2.1), run(1.9)]
    r = compare_arms(spec, base)["tpot"]
    assert r["ratio"] == pytest.approx(12.0 / 2.0)
    assert r["low"] > 1 and r["verdict"] == "worse"


def test_overlapping_spread_is_within_noise():
    r = compare_values([9.0, 10.0, 11.0], [9.5, 10.5, 11.5])
    assert r["verdict"] == "within noise" and not r["significant"]


def test_throughput_higher_is_better():
    r = compare_values([200.0, 210.0, 205.0], [100.0, 101.0, 99.0], lower_is_better=False)
    assert r["verdict"] == "better"


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
    assert r["ratio"] == 0.5 and r["verdict"] == "too few runs" and not r["significant"]


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


def test_choose_k_smallest_within_noise_of_best():
    tpot = {
        1: [10.0, 10.2, 10.1],
        2: [8.1, 8.3, 8.2],
        3: [8.0, 8.2, 7.9],
        4: [8.4, 8.0, 8.1],
        5: [9.0, 9.2, 9.1],
    }
    c = choose_k(tpot)
    assert c["best_k"] == 3
    assert c["per_k"][2]["within_noise_of_best"]  # 8.2 - 0.1 <= 8.0 + 0.1
    assert not c["per_k"][1]["within_noise_of_best"] and not c["per_k"][5]["within_noise_of_best"]
    assert c["recommended_k"] == 2


def test_choose_k_noiseless_picks_best():
    c = choose_k({1: [5.0], 2: [4.0], 3: [4.5]})
    assert c["best_k"] == 2 and c["recommended_k"] == 2


def test_choose_k_ties_prefer_smaller_k():
    assert choose_k({3: [4.0], 2: [4.0]})["best_k"] == 2


def test_choose_k_when_speculation_only_gets_slower_with_k():
    c = choose_k({1: [3.0, 3.1, 2.9], 2: [4.0, 4.1, 3.9], 3: [6.0, 6.2, 5.8]})
    assert c["recommended_k"] == 1


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
    assert g["ratio"] == pytest.approx(0.5)
    assert "0.500" in g["reason"] and "<= 0.95" in g["reason"]


def test_gate_fails_when_speculation_is_slower():
    g = gate_decision([11.0, 11.5, 10.8], [2.0, 2.1, 1.9], max_tpot_ratio=0.95, on_fail="baseline")
    assert not g["passed"] and g["action"] == "switch to baseline"
    assert g["ratio"] == pytest.approx(5.5) and g["conclusive"]
    g = gate_decision([11.0], [2.0], max_tpot_ratio=0.95, on_fail="fail")
    assert g["action"] == "fail the deploy"


def test_gate_fails_when_faster_but_not_by_the_margin():
    g = gate_decision([9.7, 9.8, 9.9], [10.0, 10.1, 9.9], max_tpot_ratio=0.95, on_fail="baseline")
    assert not g["passed"]  # 0.97 > 0.95: faster, but not by the required margin


def test_gate_records_a_band_straddling_the_threshold():
    g = gate_decision([8.0, 9.5, 11.0], [10.0, 10.0, 10.0], max_tpot_ratio=0.97, on_fail="baseline")
    assert g["passed"] and not g["conclusive"] and "straddles" in g["reason"]
