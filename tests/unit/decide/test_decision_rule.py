"""The decision rule of issue 22: the exact rank test against brute-force enumeration, the ratio
interval's duality and coverage, the false-verdict rate and power of compare, the sequential looks,
the gate and choose_k by small Monte-Carlo runs (a few thousand trials, well under a second each;
benchmarks/decision_rule.py prints the full tables), run order, fleet ratio, gate re-examination."""

import itertools
import math
import random
from datetime import UTC, datetime, timedelta

import pytest

from specdeploy.config.schema import ServeConfig
from specdeploy.decide.choose import choose_k, fleet_ratio
from specdeploy.decide.decisions import (
    ADD_RUN,
    BETTER,
    DECIDE,
    NO_DIFFERENCE,
    WORSE,
    compare_values,
    next_step,
    round_order,
    run_order,
)
from specdeploy.decide.gate_rule import (
    gate_decision,
    gate_fingerprint,
    gate_needs_recheck,
    gate_next_step,
)
from specdeploy.decide.stats import (
    attained_level,
    min_p_value,
    min_runs_per_arm,
    rank_test,
    ratio_interval,
    sequential_looks,
    sign_test,
)

ALPHA = 0.05
# the sequential compare's run budget, compare_max_repeats (plans.sequential_compare_plan)
BUDGET = ServeConfig.model_fields["compare_max_repeats"].default


def margin(trials: int, p: float = ALPHA) -> float:
    """3 binomial standard deviations of a simulated rate p."""
    return 3 * math.sqrt(p * (1 - p) / trials)


def brute_force_p(a, b, alternative):
    """The permutation p-value by listing every split of the pooled runs (mean difference of
    midranks is monotone in the rank sum, so the rank sum is the statistic)."""
    pooled = [*a, *b]
    ranks = {}
    for v in sorted(set(pooled)):
        below = sum(1 for x in pooled if x < v)
        ties = pooled.count(v)
        ranks[v] = below + (ties + 1) / 2
    r = [ranks[v] for v in pooled]
    n = len(a)
    obs = sum(r[:n])
    mean = n * (len(pooled) + 1) / 2
    sums = [sum(r[i] for i in idx) for idx in itertools.combinations(range(len(pooled)), n)]
    eps = 1e-9
    if alternative == "less":
        hits = sum(s <= obs + eps for s in sums)
    elif alternative == "greater":
        hits = sum(s >= obs - eps for s in sums)
    else:
        hits = sum(abs(s - mean) >= abs(obs - mean) - eps for s in sums)
    return hits / len(sums)


@pytest.mark.parametrize(
    "a,b",
    [
        ([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]),
        ([5.0, 1.0, 4.0, 2.5], [3.0, 6.0, 0.5]),
        ([1.0, 1.0, 2.0, 3.0], [1.0, 2.0, 2.0, 4.0, 5.0]),  # ties
        ([7.0, 7.0], [7.0, 7.0, 7.0]),  # all tied
        ([2.0], [1.0, 3.0, 4.0, 5.0]),
    ],
)
@pytest.mark.parametrize("alternative", ["two-sided", "less", "greater"])
def test_rank_test_counts_every_split(a, b, alternative):
    t = rank_test(a, b, alternative=alternative)
    assert t["p_value"] == pytest.approx(brute_force_p(a, b, alternative))
    assert t["splits"] == math.comb(len(a) + len(b), len(a))


def test_smallest_p_and_minimum_runs():
    assert min_p_value(3, 3) == pytest.approx(0.1)  # 3 + 3 runs can never reach 0.05
    assert min_p_value(4, 4) == pytest.approx(2 / 70)
    assert min_p_value(3, 3, alternative="less") == pytest.approx(1 / 20)
    assert min_runs_per_arm(0.05) == 4 and min_runs_per_arm(0.05, alternative="less") == 3
    assert min_runs_per_arm(0.01) == 5
    assert rank_test([1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0])["p_value"] == pytest.approx(2 / 70)
    assert attained_level(4, 4, 0.05) == pytest.approx(2 / 70)  # the next split gives 4/70
    assert attained_level(5, 5, 0.005) == 0.0


def test_interval_and_test_agree():
    rng = random.Random(1)
    for _ in range(300):
        n, m = rng.randint(4, 7), rng.randint(4, 7)
        shift = rng.choice([0.9, 0.97, 1.0, 1.05])
        a = [rng.lognormvariate(math.log(10 * shift), 0.03) for _ in range(n)]
        b = [rng.lognormvariate(math.log(10), 0.03) for _ in range(m)]
        r = compare_values(a, b)
        outside = r["high"] < 1 or r["low"] > 1
        assert r["significant"] == outside, (a, b, r)


def test_interval_coverage_under_a_multiplicative_effect():
    rng = random.Random(2)
    trials, covered = 2000, 0
    for _ in range(trials):
        a = [rng.gauss(9.0, 0.45) for _ in range(5)]  # exactly 0.9 x the baseline's distribution
        b = [rng.gauss(10.0, 0.5) for _ in range(5)]
        iv = ratio_interval(a, b, alpha=ALPHA)
        covered += iv["low"] <= 0.9 <= iv["high"]
    assert iv["confidence"] >= 1 - ALPHA
    assert covered / trials >= iv["confidence"] - margin(trials)


def test_interval_one_sided_and_too_few_runs():
    up = ratio_interval([5.0, 5.1, 4.9], [10.0, 10.2, 9.8], alpha=ALPHA, side="upper")
    assert up["low"] is None and up["high"] == pytest.approx(5.1 / 9.8)
    assert up["confidence"] == pytest.approx(1 - 1 / 20)
    none = ratio_interval([5.0, 5.1, 4.9], [10.0, 10.2, 9.8], alpha=ALPHA)
    assert none["low"] is None and none["high"] is None and not none["reached"]
    with pytest.raises(ValueError):
        ratio_interval([1.0, 1.0], [0.0, 2.0], alpha=ALPHA)


# --- calibration: false verdicts on identical arms, power on real effects -------------------------


def simulate_compare(runs, trials, spec_mean, rng, sd=0.5, base_mean=10.0):
    verdicts = {BETTER: 0, WORSE: 0}
    for _ in range(trials):
        s = [rng.gauss(spec_mean, sd) for _ in range(runs)]
        b = [rng.gauss(base_mean, sd) for _ in range(runs)]
        v = compare_values(s, b)["verdict"]
        if v in verdicts:
            verdicts[v] += 1
    return verdicts


@pytest.mark.parametrize("runs", [3, 4, 6, 8])
def test_identical_arms_false_verdict_rate_is_at_most_alpha(runs):
    trials = 3000
    v = simulate_compare(runs, trials, 10.0, random.Random(runs))
    assert (v[BETTER] + v[WORSE]) / trials <= ALPHA + margin(trials)


def test_power_for_a_ten_percent_effect_at_eight_runs():
    trials = 2000
    v = simulate_compare(8, trials, 9.0, random.Random(8))
    assert v[BETTER] / trials >= 0.92 and v[WORSE] == 0  # about 95 % (benchmarks/decision_rule.py)


def run_sequential(spec_draw, base_draw, budget, rng, **kw):
    s, b = [], []
    while True:
        step = next_step(s, b, max_runs=budget, **kw)
        if step["action"] == DECIDE:
            return step, len(s)
        s.append(spec_draw(rng))
        b.append(base_draw(rng))


@pytest.mark.parametrize("spending", ["first-last", "even"])
def test_sequential_false_verdict_rate_is_at_most_alpha(spending):
    rng, trials, wrong = random.Random(3), 2000, 0
    for _ in range(trials):
        step, _ = run_sequential(
            lambda r: r.gauss(10, 0.5), lambda r: r.gauss(10, 0.5), BUDGET, rng, spending=spending
        )
        wrong += step["result"]["verdict"] in (BETTER, WORSE)
    assert wrong / trials <= ALPHA + margin(trials)


def test_sequential_stops_at_the_minimum_on_the_trained_pair():
    # ratio 0.46, run-to-run CV 2 %: every trial decides "better" at the first look (4 + 4)
    rng = random.Random(4)
    for _ in range(300):
        step, runs = run_sequential(
            lambda r: r.gauss(4.6, 0.092), lambda r: r.gauss(10, 0.2), BUDGET, rng
        )
        assert runs == 4 and step["result"]["verdict"] == BETTER


def test_sequential_spends_the_budget_on_a_close_call():
    rng, trials, runs_used, better = random.Random(5), 500, 0, 0
    for _ in range(trials):
        step, runs = run_sequential(
            lambda r: r.gauss(9.0, 0.5), lambda r: r.gauss(10, 0.5), BUDGET, rng
        )
        runs_used += runs
        better += step["result"]["verdict"] == BETTER
    assert 5.0 < runs_used / trials < 8.0  # some stop at 4, the rest go to the budget
    assert better / trials >= 0.85  # benchmark: 93 %


def test_sequential_looks_spend_at_most_alpha():
    for budget in range(4, 13):
        for spending in ("first-last", "even"):
            for alternative in ("two-sided", "less"):
                looks = sequential_looks(
                    budget, alpha=ALPHA, alternative=alternative, spending=spending
                )
                assert sum(lk["spent"] for lk in looks) <= ALPHA + 1e-12
                assert looks[-1]["runs"] == budget
    assert sequential_looks(8)[0] == {"runs": 4, "level": 2 / 70, "spent": 2 / 70}
    assert [lk["runs"] for lk in sequential_looks(8)] == [4, 8]
    assert sequential_looks(3) == []  # 3 + 3 cannot reach 0.05 two-sided
    assert sequential_looks(3, alternative="less") == [{"runs": 3, "level": 0.05, "spent": 0.05}]
    assert [lk["runs"] for lk in sequential_looks(6, alternative="less")] == [4, 6]


def test_next_step_actions():
    assert next_step([], [], max_runs=8)["action"] == ADD_RUN
    assert next_step([1.0, 2.0], [1.0], max_runs=8)["action"] == "add a run to the baseline arm"
    four = next_step([5.0, 5.1, 5.2, 5.05], [10.0, 10.1, 10.2, 10.05], max_runs=8)
    assert four["action"] == DECIDE and four["result"]["verdict"] == BETTER
    assert four["result"]["alpha"] == ALPHA and four["result"]["look_alpha"] == pytest.approx(
        2 / 70
    )
    close = next_step([9.0, 10.0, 11.0, 10.2], [9.5, 10.5, 11.5, 9.8], max_runs=8)
    assert close["action"] == ADD_RUN and "budget 8" in close["reason"]
    between = next_step([1.0] * 5, [1.0] * 5, max_runs=8)
    assert between["action"] == ADD_RUN and "next look is at 8" in between["reason"]
    end = next_step([9.0, 10.0, 11.0, 10.2] * 2, [9.5, 10.5, 11.5, 9.8] * 2, max_runs=8)
    assert end["action"] == DECIDE and end["result"]["verdict"] == NO_DIFFERENCE
    assert "budget (8 per arm) is spent" in end["reason"]
    with pytest.raises(ValueError, match="can never reach"):
        next_step([], [], max_runs=3)


# --- the gate -------------------------------------------------------------------------------------


def simulate_gate(spec_mean, base_mean, cv, trials, rng, **kw):
    kept = conclusive_fallback = 0
    for _ in range(trials):
        s = [rng.gauss(spec_mean, cv * spec_mean) for _ in range(2)]
        b = [rng.gauss(base_mean, cv * base_mean) for _ in range(2)]
        while True:
            step = gate_next_step(s, b, max_tpot_ratio=0.95, on_fail="baseline", **kw)
            if step["action"] == DECIDE:
                break
            s.append(rng.gauss(spec_mean, cv * spec_mean))
            b.append(rng.gauss(base_mean, cv * base_mean))
        kept += step["result"]["passed"]
        conclusive_fallback += not step["result"]["passed"] and step["result"]["conclusive"]
    return kept / trials, conclusive_fallback / trials


@pytest.mark.parametrize("budget", [3, 6])
def test_gate_false_keep_rate_at_the_margin_is_at_most_alpha(budget):
    trials = 2000
    kept, _ = simulate_gate(9.5, 10.0, 0.02, trials, random.Random(budget), max_runs=budget)
    assert kept <= ALPHA + margin(trials)  # exactly at max_tpot_ratio: the worst case
    kept, _ = simulate_gate(10.0, 10.0, 0.02, 500, random.Random(budget), max_runs=budget)
    assert kept <= ALPHA  # identical arms: far below


@pytest.mark.parametrize("budget", [3, 6])
def test_gate_keeps_the_trained_pair_and_drops_a_poor_draft(budget):
    kept, _ = simulate_gate(4.6, 10.0, 0.02, 300, random.Random(6), max_runs=budget)
    assert kept >= 0.95
    kept, conclusive = simulate_gate(13.0, 10.0, 0.02, 300, random.Random(7), max_runs=budget)
    assert kept == 0 and conclusive >= 0.95


def test_gate_next_step_decides_at_the_first_look_on_a_large_effect():
    step = gate_next_step(
        [5.0, 5.1, 4.9, 5.05],
        [10.0, 10.2, 9.8, 10.1],
        max_tpot_ratio=0.95,
        on_fail="baseline",
        max_runs=6,
    )
    assert step["action"] == DECIDE and step["result"]["passed"]
    assert "this look's level 0.0143 (family alpha 0.05)" in step["result"]["reason"]
    more = gate_next_step(
        [5.0, 5.1, 4.9], [10.0, 10.2, 9.8], max_tpot_ratio=0.95, on_fail="baseline", max_runs=6
    )
    assert more["action"] == ADD_RUN


def test_gate_decides_on_runs_not_requests():
    # many per-request values of one start are not fresh-server runs: the caller passes one value
    # per run; a single run per arm is refused
    with pytest.raises(ValueError):
        gate_decision([5.0], [10.0], max_tpot_ratio=0.95, on_fail="baseline")


# --- choose_k -------------------------------------------------------------------------------------


def test_choose_k_on_seven_identical_k_recommends_the_designed_answer():
    rng, trials = random.Random(9), 600
    not_smallest = not_off = 0
    for _ in range(trials):
        tpot = {k: [rng.gauss(10, 0.5) for _ in range(5)] for k in range(1, 8)}
        not_smallest += choose_k(tpot)["recommended_k"] != 1
        base = [rng.gauss(10, 0.5) for _ in range(5)]
        not_off += choose_k(tpot, baseline=base)["speculation"] != "off"
    assert not_smallest / trials <= ALPHA + margin(trials)
    assert not_off / trials <= ALPHA + margin(trials)


def test_choose_k_finds_a_real_optimum_against_the_baseline():
    curve = {1: 0.62, 2: 0.52, 3: 0.48, 4: 0.50, 5: 0.54, 6: 0.58, 7: 0.63}
    rng, picks = random.Random(10), {}
    for _ in range(100):
        tpot = {k: [rng.gauss(10 * r, 0.2 * r) for _ in range(5)] for k, r in curve.items()}
        base = [rng.gauss(10, 0.2) for _ in range(5)]
        c = choose_k(tpot, baseline=base)
        picks[c["recommended_k"]] = picks.get(c["recommended_k"], 0) + 1
    assert set(picks) <= {2, 3, 4} and picks.get(None) is None  # never k=1, never off


# --- run order ------------------------------------------------------------------------------------


def test_alternating_order_never_puts_one_arm_first_always():
    o = run_order(["baseline", "speculative"], 4, mode="alternate")
    assert o["order"] == ["baseline", "speculative", "speculative", "baseline"] * 2
    assert o["seed"] is None and o["mode"] == "alternate"


def test_random_order_is_blocked_reproducible_and_records_its_seed():
    arms = ["baseline", "speculative"]
    o = run_order(arms, 20)
    assert isinstance(o["seed"], int) and o["mode"] == "random"
    again = run_order(arms, 20, seed=o["seed"])
    assert again["order"] == o["order"]
    rounds = [o["order"][i : i + 2] for i in range(0, 40, 2)]
    assert all(sorted(r) == arms for r in rounds)  # every arm once per round
    firsts = {r[0] for r in rounds}
    assert firsts == set(arms)  # baseline is not always first (P(fail) = 2/2^20)
    assert round_order(arms, 7, seed=o["seed"]) == rounds[7]  # a sequential run adds rounds
    with pytest.raises(ValueError):
        round_order(arms, 0, seed=None)


# --- fleet ----------------------------------------------------------------------------------------


def test_fleet_ratio_is_the_median_of_per_host_ratios():
    f = fleet_ratio({"h1": 0.5, "h2": 0.6, "h3": 1.1, "h4": None})
    assert f["ratio"] == 0.6 and f["min"] == 0.5 and f["max"] == 1.1 and f["hosts"] == 3
    assert f["left_out"] == ["h4"] and f["sign_test"]["below"] == 2
    assert "per-host" in f["how"]
    assert fleet_ratio({})["ratio"] is None
    assert sign_test([0.5] * 6)["p_value"] == pytest.approx(2 / 64)


# --- gate re-examination --------------------------------------------------------------------------


def fp(**kw):
    args = {
        "speculative_unit_sha256": "s1",
        "baseline_unit_sha256": "b1",
        "workload": {"request_rate": 2.0, "temperature": 0.0},
        "max_tpot_ratio": 0.95,
        "on_fail": "baseline",
    }
    args.update(kw)
    return gate_fingerprint(**args)


def test_a_fall_back_is_reexamined_when_workload_or_config_changed_or_it_is_old():
    now = datetime(2026, 12, 10, tzinfo=UTC)
    decided = (now - timedelta(days=2)).isoformat()
    fell_back = {"passed": False, "fingerprint": fp(), "decided_at": decided}
    assert gate_needs_recheck(None, fp(), now=now)["recheck"]
    same = gate_needs_recheck(fell_back, fp(), now=now, recheck_days=7)
    assert not same["recheck"] and "same units" in same["why"]
    changed = gate_needs_recheck(
        fell_back, fp(workload={"request_rate": 4.0, "temperature": 0.0}), now=now
    )
    assert changed["recheck"] and "workload_sha256" in changed["why"]
    unit = gate_needs_recheck(fell_back, fp(speculative_unit_sha256="s2"), now=now)
    assert unit["recheck"] and "speculative_unit_sha256" in unit["why"]
    old = gate_needs_recheck(fell_back, fp(), now=now + timedelta(days=6), recheck_days=7)
    assert old["recheck"] and "8.0 days ago" in old["why"]
    assert not gate_needs_recheck(fell_back, fp(), now=now + timedelta(days=60))["recheck"]
    passed = {"passed": True, "fingerprint": fp(), "decided_at": decided}
    assert not gate_needs_recheck(passed, fp(), now=now + timedelta(days=60), recheck_days=7)[
        "recheck"
    ]
    assert gate_needs_recheck({"passed": False}, fp(), now=now)["recheck"]  # old record
