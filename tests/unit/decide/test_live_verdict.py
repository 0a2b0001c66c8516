"""The live verdict (decide/live_rule.py): windows from vLLM's counters, the exact sign test over
paired window ratios with its false rate on identical arms, detection of pays and loses, and the
autopilot's hysteresis as a state machine."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from specdeploy.decide import live_rule as live
from specdeploy.decide.stats import sign_test
from tests.unit import DATA


def counters(tpot_sum=0.0, count=0.0, accepted=0.0, drafted=0.0):
    return {
        "tpot_sum": tpot_sum,
        "tpot_count": count,
        "requests": count,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "drafts": 0.0,
    }


def window(ratio, n=50, start=0.0):
    zero = {arm: counters() for arm in live.ARMS}
    after = {
        "speculative": counters(0.02 * ratio * n, n, 60.0, 100.0),
        "baseline": counters(0.02 * n, n),
    }
    return live.live_window(start, start + 300, zero, after)


# --- windows from the recorded /metrics -----------------------------------------------------------


def test_arm_counters_read_the_pinned_releases_own_metrics():
    """The TPOT histogram's _sum/_count and the spec-decode counters of vLLM 0.32.0's /metrics
    (recorded), summed over an arm's instances; a window between the two scrapes."""
    before = (DATA / "vllm-0.32.0-metrics-before.txt").read_text()
    after = (DATA / "vllm-0.32.0-metrics-after.txt").read_text()
    one = live.arm_counters([after])
    assert one["tpot_count"] == 13.0 and one["tpot_sum"] == pytest.approx(0.030354317179919633)
    assert one["draft_tokens"] > 0 and one["accepted_tokens"] > 0
    two = live.arm_counters([after, after])
    assert two["tpot_count"] == 26.0
    w = live.live_window(
        0,
        300,
        {"speculative": live.arm_counters([before]), "baseline": live.arm_counters([before])},
        {"speculative": one, "baseline": one},
        min_requests=1,
    )
    assert w["skipped"] is None and w["ratio"] == pytest.approx(1.0)
    assert 0 < w["speculative"]["acceptance_rate"] <= 1
    assert w["baseline"]["requests"] == w["speculative"]["requests"] > 0


def test_windows_with_too_little_traffic_or_a_restart_are_skipped_and_counted():
    few = window(1.0, n=5)
    assert few["skipped"].startswith("too little traffic") and few["ratio"] is None
    zero = {arm: counters(1.0, 100) for arm in live.ARMS}
    restarted = live.live_window(
        0, 300, zero, {"speculative": counters(0.1, 10), "baseline": counters(2.0, 200)}
    )
    assert restarted["skipped"].startswith("a counter went back")
    windows = [few, restarted] + [window(0.8, start=300 * i) for i in range(12)]
    result = live.live_decisions(windows)
    assert result["skipped"] == 2 and result["current"]["windows"] == 12
    assert result["skipped_why"] == {
        "too little traffic": 1,
        "a counter went back (a server restarted)": 1,
    }


def test_snapshots_pair_in_time_order():
    snaps = [
        {
            "t": t,
            "speculative": counters(0.016 * 30 * i, 30 * i),
            "baseline": counters(0.02 * 30 * i, 30 * i),
        }
        for i, t in enumerate((0, 300, 600))
    ]
    windows = live.windows_from_snapshots(list(reversed(snaps)))
    assert [(w["start"], w["end"]) for w in windows] == [(0, 300), (300, 600)]
    assert all(w["ratio"] == pytest.approx(0.8) for w in windows)


# --- the verdict ----------------------------------------------------------------------------------


def test_pays_and_loses_say_so_with_the_median_and_its_band():
    pays = live.live_decisions([window(0.8 + 0.01 * (i % 3), start=300 * i) for i in range(12)])
    current = pays["current"]
    assert current["verdict"] == live.PAYS
    assert current["text"].startswith("pays 0.81x (0.80-0.82) over 12 windows")
    assert current["confidence"] >= 0.95 and current["acceptance_rate"] == pytest.approx(0.6)
    loses = live.live_decisions([window(1.2, start=300 * i) for i in range(12)])["current"]
    assert loses["verdict"] == live.LOSES and loses["low"] > 1


def test_undecided_before_a_block_and_on_mixed_ratios():
    early = live.live_decisions([window(0.5, start=300 * i) for i in range(11)])
    assert early["current"]["verdict"] == live.UNDECIDED and early["pending"] == 11
    assert early["current"]["text"] == "undecided: 11 of 12 usable windows so far"
    mixed = [window(0.9 if i % 2 else 1.1, start=300 * i) for i in range(12)]
    assert live.live_decisions(mixed)["current"]["verdict"] == live.UNDECIDED


def test_the_interval_is_the_one_the_sign_test_inverts_to():
    """1 lies outside the interval exactly when the sign test rejects at alpha."""
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(6, 20)
        ratios = [rng.lognormvariate(rng.uniform(-0.2, 0.2), 0.1) for _ in range(n)]
        band = live.median_interval(ratios, alpha=0.05)
        rejects = sign_test(ratios)["p_value"] <= 0.05
        assert rejects == (band["low"] > 1 or band["high"] < 1)


def test_too_few_windows_per_decision_are_refused():
    assert live.min_live_windows(0.05) == 6 and live.min_live_windows(0.01) == 8
    with pytest.raises(ValueError, match="at least 6"):
        live.live_decisions([], windows_per_decision=5)
    # 5 windows all below 1 give p = 2/32 = 0.0625 > 0.05: never decided, whatever the data
    assert sign_test([0.5] * 5)["p_value"] > 0.05


def test_false_verdicts_on_identical_arms_stay_under_alpha():
    """A/A: 3000 simulated decisions (seeded) on arms that do not differ, with the load drifting
    20 % from window to window: the share that says pays or loses is <= alpha, and close to the
    exact test's attained level 2 P(Bin(12, 1/2) <= 2) = 0.039 (it is exact, not just bounded)."""
    rng = random.Random(20261205)
    verdicts = []
    for _ in range(3000):
        windows = live.simulated_windows(rng, 12, ratio=1.0, requests_per_window=200)
        verdicts.append(live.live_decisions(windows)["current"]["verdict"])
    false_rate = sum(v != live.UNDECIDED for v in verdicts) / len(verdicts)
    attained = 2 * sum(math.comb(12, i) for i in range(3)) / 2**12
    assert false_rate <= 0.05
    assert abs(false_rate - attained) < 4 * math.sqrt(attained * (1 - attained) / 3000)
    loses = sum(v == live.LOSES for v in verdicts) / len(verdicts)
    assert loses <= 0.025 + 3 * math.sqrt(0.025 / 3000)  # one direction: alpha / 2


def test_pays_and_loses_are_found_in_an_hour_at_moderate_traffic():
    """At 0.5 requests/s on a box of 2 (one control), an hour finds a 10 % effect either way."""
    assert live.live_power(0.9, requests_per_s=0.5, trials=100)["power"] >= 0.9
    assert live.live_power(1.1, requests_per_s=0.5, trials=100)["power"] >= 0.9
    quiet = live.live_power(0.9, requests_per_s=0.05, trials=50)
    assert quiet["usable_windows"] < 0.1 and quiet["power"] < 0.5  # too little traffic: skipped


def test_control_arm_cost():
    assert live.control_arm_cost(4, 1, 0.25) == pytest.approx(0.0625)
    assert live.control_arm_cost(2, 1, 0.2) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        live.control_arm_cost(2, 3, 0.2)


# --- the autopilot --------------------------------------------------------------------------------


def decision(verdict):
    return {"verdict": verdict, "text": verdict}


def test_falls_back_after_n_loses_in_a_row_and_an_undecided_breaks_the_streak():
    steps = live.autopilot_replay(
        [decision(v) for v in ("loses", "loses", "undecided", "loses", "loses", "loses")],
        mode="fallback",
        after=3,
    )
    assert [s["action"] for s in steps] == [live.KEEP] * 5 + [live.FALL_BACK]
    assert steps[-1]["state"]["serving"] == "baseline"
    assert "lost 3 decisions in a row" in steps[-1]["why"]


def test_alert_only_alerts_and_fallback_returns_only_by_a_deploy():
    alert = live.autopilot_replay([decision("loses")] * 4, mode="alert", after=2)
    assert [s["action"] for s in alert] == [live.KEEP, live.ALERT, live.ALERT, live.ALERT]
    assert all(s["state"]["serving"] == "speculative" for s in alert)
    back = live.autopilot_replay(
        [decision("loses")] * 2 + [decision("pays")] * 3, mode="fallback", after=2
    )
    assert [s["action"] for s in back][-2:] == [live.ALERT, live.ALERT]
    assert "a deploy returns" in back[-1]["why"] and back[-1]["state"]["serving"] == "baseline"
    both = live.autopilot_replay(
        [decision("loses")] * 2 + [decision("pays")] * 2, mode="both", after=2
    )
    assert both[-1]["action"] == live.RETURN and both[-1]["state"]["serving"] == "speculative"
    off = live.autopilot_replay([decision("loses")] * 9, mode="off", after=1)
    assert {s["action"] for s in off} == {live.KEEP}


class Autopilot(RuleBasedStateMachine):
    """Any sequence of verdicts, any mode: a switch comes only after `after` decisions in a row
    with the verdict that calls for it, two switches are at least `after` decisions apart (it
    never flaps), "fallback" switches at most once, "alert" and "off" never."""

    def __init__(self):
        super().__init__()
        self.mode = random.Random(len(live.AUTOPILOT_MODES)).choice(live.AUTOPILOT_MODES)
        self.after = 2
        self.state = None
        self.history: list[str] = []
        self.switch_at: list[int] = []

    @rule(mode=st.sampled_from(live.AUTOPILOT_MODES), after=st.integers(1, 4))
    def start(self, mode, after):
        self.mode, self.after = mode, after
        self.state = live.autopilot_start()
        self.history, self.switch_at = [], []

    @rule(verdict=st.sampled_from(live.LIVE_VERDICTS))
    def decide(self, verdict):
        if self.state is None:
            self.state = live.autopilot_start()
        before = self.state["serving"]
        self.state, action, _ = live.autopilot_step(
            self.state, decision(verdict), mode=self.mode, after=self.after
        )
        self.history.append(verdict)
        if action in (live.FALL_BACK, live.RETURN):
            assert self.state["serving"] != before
            wanted = live.LOSES if action == live.FALL_BACK else live.PAYS
            assert self.history[-self.after :] == [wanted] * self.after
            if self.switch_at:
                assert len(self.history) - self.switch_at[-1] >= self.after
            self.switch_at.append(len(self.history))
        else:
            assert self.state["serving"] == before

    @invariant()
    def modes_keep_their_word(self):
        if self.mode in ("off", "alert"):
            assert not self.switch_at
        if self.mode == "fallback":
            assert len(self.switch_at) <= 1


TestAutopilot = Autopilot.TestCase
TestAutopilot.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


@given(st.lists(st.sampled_from(live.LIVE_VERDICTS), max_size=60), st.integers(1, 5))
@settings(max_examples=200, deadline=None)
def test_replay_is_deterministic(verdicts, after):
    """The same recorded decisions give the same actions: what the record says can be replayed."""
    ds = [decision(v) for v in verdicts]
    assert live.autopilot_replay(ds, mode="both", after=after) == live.autopilot_replay(
        ds, mode="both", after=after
    )


# --- a box with more speculative instances than control ones --------------------------------------


def test_matched_instances_take_the_speculative_ones_in_turn():
    spec, base = ["b-0", "b-1", "b-2"], ["b-3"]
    turns = [live.matched_instances(spec, base, i)[0] for i in range(4)]
    assert turns == [["b-0"], ["b-1"], ["b-2"], ["b-0"]]
    assert live.matched_instances(["a", "b"], ["c", "d"], 5) == (["a", "b"], ["c", "d"])
    # a fallen-back box: its one speculative instance against one baseline instance at a time
    assert [live.matched_instances(["b-0"], ["b-1", "b-2"], i)[1] for i in range(3)] == [
        ["b-1"],
        ["b-2"],
        ["b-1"],
    ]


def box_snapshots(rng, windows, *, instances=4, requests=12, cv=1.0):
    """Cumulative per-instance counters of an A/A box (every instance the same), routed at random:
    each instance's window mean TPOT lognormal with spread cv / sqrt(requests), mean kept equal."""
    names = [f"b-{i}" for i in range(instances)]
    total = {n: counters() for n in names}
    snaps = [{"t": 0, "speculative": {n: dict(total[n]) for n in names[:-1]},
              "baseline": {names[-1]: dict(total[names[-1]])}}]  # fmt: skip
    for w in range(windows):
        level = rng.lognormvariate(0, 0.2)
        for n in names:
            sigma = cv / math.sqrt(requests)
            mean = 0.02 * level * rng.lognormvariate(-sigma * sigma / 2, sigma)
            total[n]["tpot_sum"] += mean * requests
            total[n]["tpot_count"] += requests
            total[n]["requests"] += requests
        snaps.append({"t": 300 * (w + 1),
                      "speculative": {n: dict(total[n]) for n in names[:-1]},
                      "baseline": {names[-1]: dict(total[names[-1]])}})  # fmt: skip
    return snaps


def test_unequal_arms_are_matched_so_identical_arms_lean_neither_way():
    """A box of 4 with one control instance, skewed TPOTs, identical instances: compared
    instance for instance, a false loses is as rare as a false pays and <= alpha / 2. Summing
    the 3 speculative instances instead (the less noisy arm's median sits higher) leans to loses:
    the check below fails for that."""
    rng = random.Random(20261206)
    matched, summed = [], []
    for _ in range(1500):
        snaps = box_snapshots(rng, 12)
        matched.append(live.live_decisions(live.windows_from_snapshots(snaps, min_requests=5)))
        flat = [{"t": s["t"], **{arm: live._summed(list(s[arm].values())) for arm in live.ARMS}}
                for s in snaps]  # fmt: skip
        summed.append(live.live_decisions(live.windows_from_snapshots(flat, min_requests=5)))

    def rate(results, verdict):
        return sum(r["current"]["verdict"] == verdict for r in results) / len(results)

    sd = math.sqrt(0.02 * 0.98 / 1500)
    assert rate(matched, live.LOSES) <= 0.025 + 2 * sd
    assert abs(rate(matched, live.LOSES) - rate(matched, live.PAYS)) < 4 * sd
    assert rate(summed, live.LOSES) - rate(summed, live.PAYS) > 4 * sd  # the bias matching removes
