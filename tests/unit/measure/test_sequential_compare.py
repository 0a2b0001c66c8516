"""The sequential compare (compare_repeats unset, the default) without hosts: plans'
sequential_compare_plan driven by a fake host whose run-level TPOTs are known, the report's replay
of the same rule from the raw files, and the budget refused before any host is touched."""

import json
import math
from types import SimpleNamespace

import pytest

from specdeploy.config.problems import ConfigError
from specdeploy.config.schema import ServeConfig
from specdeploy.decide.decisions import BETTER, NO_DIFFERENCE
from specdeploy.measure import plans
from specdeploy.measure.plans import SequentialCompare, sequential_compare_plan
from specdeploy.report import summary as report
from tests.unit.handed import handed
from tests.unit.report.test_report import bench_json, write_run

B, S = "baseline", "speculative"


class FakeHost:
    """Plays harness.sample: the n-th counted run of an arm has TPOT values[arm][n]."""

    def __init__(self, values):
        self.values, self.results = values, []

    def read(self):
        return list(self.results)

    def run(self, plan):
        for arm, warm in plan:
            n = sum(
                1
                for r in self.results
                if r["specdeploy"]["arm"] == arm.label and not r["specdeploy"]["warmup"]
            )
            tpot = 99.0 if warm else self.values.get(arm.label, [2.0] * 20)[n]
            self.results.append(
                {
                    **bench_json(tpot),
                    "specdeploy": {"arm": arm.label, "index": len(self.results), "warmup": warm},
                }
            )
        return [(r["specdeploy"]["arm"], r["specdeploy"]["warmup"]) for r in self.results]


def run(values, *, max_runs=8, warmup_runs=0, then=()):
    fake, log = FakeHost(values), []
    plan = sequential_compare_plan(
        max_runs=max_runs,
        warmup_runs=warmup_runs,
        alpha=0.05,
        read=fake.read,
        then=then,
        log=log.append,
    )
    return fake, fake.run(plan), log


def counted(labels, arm):
    return sum(1 for a, w in labels if a == arm and not w)


def test_a_large_effect_stops_at_the_minimum():
    """The trained sandbox pair's ratio 0.46: every speculative run below every baseline run, so
    the first look (4 + 4 runs, p = 2/70) decides and no further round runs."""
    values = {S: [4.6, 4.7, 4.5, 4.65] + [4.6] * 4, B: [10.0, 10.2, 9.9, 10.1] + [10.0] * 4}
    apc = plans.Arm("apc-off", False)
    fake, labels, log = run(values, warmup_runs=1, then=((apc, False),))
    assert labels == [
        (S, True),  # the discarded warm-up
        (B, False),
        (S, False),
        (S, False),
        (B, False),
        (B, False),
        (S, False),
        (S, False),
        (B, False),
        ("apc-off", False),  # the APC profile after the decision
    ]
    assert len(log) == 1 and log[0].startswith("sequential compare, 4 runs per arm: decide now")
    assert "p = 0.0286" in log[0]


def test_a_close_call_spends_the_budget():
    """Arms 1 % apart with overlapping runs: no look before the budget can decide, so the compare
    adds alternating rounds up to 8 + 8 runs and decides there, at the last look's level."""
    spec = [10.00, 9.95, 10.10, 9.90, 10.05, 9.85, 10.15, 9.92]
    base = [10.02, 10.08, 9.97, 10.12, 9.94, 10.11, 10.03, 10.06]
    _, labels, log = run({S: spec, B: base})
    assert counted(labels, S) == counted(labels, B) == 8
    # rounds keep alternating which arm goes first: B S, S B, B S, ...
    firsts = [labels[2 * r][0] for r in range(8)]
    assert firsts == [B, S] * 4
    assert [line.split(":")[0] for line in log] == [
        f"sequential compare, {r} runs per arm" for r in range(4, 9)
    ]
    assert all("add a run to each arm" in line for line in log[:-1])
    assert "decide now" in log[-1] and "budget (8 per arm) is spent" in log[-1]


def test_identical_arms_end_with_no_significant_difference():
    same = [10.0, 10.1, 9.9, 10.05, 9.95, 10.02, 9.98, 10.0]
    _, labels, log = run({S: same, B: same})
    assert counted(labels, S) == counted(labels, B) == 8
    assert log[-1].startswith(f"sequential compare, 8 runs per arm: decide now: {NO_DIFFERENCE}")


def test_a_smaller_budget_stops_sooner():
    """compare_max_repeats = 4: one look at alpha, the fixed-size test."""
    same = [10.0, 10.1, 9.9, 10.05]
    _, labels, log = run({S: same, B: same}, max_runs=4)
    assert counted(labels, S) == 4 and len(log) == 1 and NO_DIFFERENCE in log[0]


def sequential_conditions(max_runs=8):
    plan = SequentialCompare(max_runs, 0, 0.05, (), out_dir=None)
    return {"kind": "compare", "decision_alpha": 0.05, **plan.conditions()}


@pytest.mark.parametrize(
    ("values", "runs", "verdict", "stopped_by"),
    [
        ({S: [4.6, 4.7, 4.5, 4.65], B: [10.0, 10.2, 9.9, 10.1]}, 4, BETTER, "a significant look"),
        (
            {S: [10.0, 10.1, 9.9, 10.05, 9.95, 10.02, 9.98, 10.0]} | {B: [10.0] * 8},
            8,
            NO_DIFFERENCE,
            "the run budget",
        ),
    ],
)
def test_the_report_replays_the_rule_from_the_raw_files(
    tmp_path, values, runs, verdict, stopped_by
):
    """summary.json/md carry every step's p and what stopped the compare, recomputed from the raw
    bench JSONs; the TPOT verdict is the sequential one (at its look's level), not a fresh test
    at alpha over however many runs there were."""
    fake, _, log = run(values)
    samples = [
        (
            r["specdeploy"]["arm"],
            r["specdeploy"]["warmup"],
            bench_json(r["median_tpot_ms"]),
            None,
            None,
        )
        for r in fake.results
    ]
    write_run(tmp_path, "h1", samples, sequential_conditions())
    s = report.write(tmp_path, "compare")
    seq = s["hosts"]["h1"]["sequential"]
    assert [st["runs_per_arm"] for st in seq["steps"]] == list(range(4, runs + 1))
    assert len(seq["steps"]) == len(log)  # the plan asked the rule as often as the report replays
    assert seq["decided"] and seq["stopped_by"] == stopped_by
    assert [lk["runs"] for lk in seq["looks"]] == [4, 8] and seq["max_runs"] == 8
    tpot = s["hosts"]["h1"]["ratios"]["tpot"]
    assert tpot["verdict"] == verdict and tpot == seq["result"]
    assert tpot["runs"] == {"speculative": runs, "baseline": runs}
    if runs == 4:
        assert seq["steps"][0]["p_value"] == pytest.approx(2 / math.comb(8, 4))
        assert tpot["look_alpha"] == pytest.approx(2 / 70) and tpot["high"] < 1
    else:
        assert [st["look_level"] for st in seq["steps"]][1:4] == [None] * 3  # no look at 5-7
        assert tpot["look_alpha"] == pytest.approx(seq["looks"][-1]["level"])
    on_disk = json.loads((tmp_path / "summary.json").read_text())["hosts"]["h1"]["sequential"]
    assert on_disk["stopped_by"] == stopped_by
    md = (tmp_path / "summary.md").read_text()
    assert "Sequential compare on TPOT" in md and f"Stopped by {stopped_by}" in md
    assert "| 4 | 0.0286 |" in md


def cfg(**kw):
    return ServeConfig(
        vllm_version="0.32.0",
        target_model="t",
        speculative_config={"model": "d", "num_speculative_tokens": 3},
        max_model_len=1024,
        **kw,
    )


def test_compare_measurement_picks_sequential_by_default(monkeypatch, tmp_path):
    monkeypatch.setattr(plans, "host", SimpleNamespace(name="h1", print_prefix="[h1] "))
    monkeypatch.setenv("SPECDEPLOY_REPORTS", str(tmp_path))
    plan, cond, what = plans.compare_measurement(cfg(), **handed(cfg()))
    assert isinstance(plan, SequentialCompare) and plan.max_runs == 8
    assert cond["repeats"] is None and cond["sequential"]["first_runs"] == 4
    assert "sequential: 4 to 8 runs per arm" in what
    fixed, cond, _ = plans.compare_measurement(cfg(compare_repeats=3), **handed(cfg()))
    assert isinstance(fixed, list) and cond["repeats"] == 3 and "sequential" not in cond


def test_a_budget_that_cannot_reach_alpha_is_refused(monkeypatch):
    monkeypatch.setattr(plans, "host", SimpleNamespace(name="h1", print_prefix="[h1] "))
    with pytest.raises(ConfigError) as e:
        plans.compare_measurement(cfg(compare_max_repeats=3), **handed(cfg()))
    assert str(e.value).startswith("h1: compare_max_repeats: 3 runs per arm can never reach")
    assert "at least 4" in str(e.value)
