"""The fleet at scale on a small fleet (issue 37): the real serve deploy planned on 20 stand-in
hosts (tests/stand_in.py, which benchmarks/fleet_scale/plan_fleet.py times on 1,000) runs the
fleet-wide work once (a broken cache reads the release tables per host and fails here), and each
host sends the same commands whatever the fleet's size. tests/rollout_model.py's
arithmetic over the rollout's own batches (flows/rollout.plan_batches): the waves of a batch, and
the issue's bar (200 hosts gated per class at a 10 % ramp within 4 h)."""

from __future__ import annotations

import math

import pytest
from pyinfra.context import ctx_host, ctx_state

from specdeploy.checks import request_set
from specdeploy.flows.rollout import plan_batches
from specdeploy.releases import capabilities
from tests import rollout_model as model
from tests import stand_in


@pytest.fixture(autouse=True)
def pyinfra_context():
    before = ctx_host.get(), ctx_state.get()  # pyinfra leaves its last host in context
    yield
    ctx_host.set(before[0]), ctx_state.set(before[1])


def test_planning_twenty_stand_in_hosts_reads_the_release_tables_once():
    capabilities._tables.cache_clear()
    request_set._rows_over_limit.cache_clear()  # earlier tests tokenize request sets too
    one = stand_in.measure(1)
    twenty = stand_in.measure(20)
    assert twenty["release table reads"] == 1  # once for both fleets, not once per host
    assert twenty["request set tokenizings"] <= 1
    per_host = set(twenty["planning_commands"].values())
    assert per_host == set(one["planning_commands"].values()) and min(per_host) > 0


def test_the_rollout_model_counts_waves_and_meets_the_bar():
    steps = model.Steps()
    serial = model.wall_time_s(model.Plan(200, ramp="1", max_unavailable=1, gating="none"), steps)
    assert serial == pytest.approx(200 * (steps.batch_overhead_s + steps.restart()))
    ramp = model.ramp_plans(200, "per class", runs_per_arm=6, classes=1)
    parallel = model.wall_time_s(ramp["10 % ramp, max_unavailable = batch"], steps)
    canary = steps.batch_overhead_s + steps.restart() + steps.gate(6)
    batches = math.ceil(199 / 20)
    hosts = [(f"h{i}", ["canary"] if i == 0 else []) for i in range(200)]
    assert [len(b) for b in plan_batches(hosts, "canary", "10%")] == [1] + [20] * 9 + [19]
    assert parallel == pytest.approx(canary + batches * (steps.batch_overhead_s + steps.restart()))
    assert parallel <= 4 * 3600
