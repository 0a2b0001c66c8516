"""The fleet-scale benchmarks' own code on a small fleet (issue 37): benchmarks/fleet_scale/
plan_fleet.py plans the real serve deploy on 20 stand-in hosts and the fleet-wide work runs once
(a broken cache reads the release tables per host and fails here); each host sends the same
commands whatever the fleet's size. rollout_model.py's arithmetic: the waves of a batch, and the
issue's bar (200 hosts gated per class at a 10 % ramp within 4 h)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
from pyinfra.context import ctx_host, ctx_state

from specdeploy.checks import capabilities

FOLDER = Path(__file__).resolve().parents[2] / "benchmarks" / "fleet_scale"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"fleet_scale_{name}", FOLDER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def pyinfra_context():
    before = ctx_host.get(), ctx_state.get()  # pyinfra leaves its last host in context
    yield
    ctx_host.set(before[0]), ctx_state.set(before[1])


def test_planning_twenty_stand_in_hosts_reads_the_release_tables_once():
    plan_fleet = load("plan_fleet")
    capabilities._tables.cache_clear()
    one = plan_fleet.measure(1)
    twenty = plan_fleet.measure(20)
    assert twenty["release table reads"] == 1  # once for both fleets, not once per host
    assert twenty["request set tokenizings"] <= 1
    per_host = set(twenty["planning_commands"].values())
    assert per_host == set(one["planning_commands"].values()) and min(per_host) > 0


def test_the_rollout_model_counts_waves_and_meets_the_bar():
    model = load("rollout_model")
    steps = model.Steps()
    serial = model.wall_time_s(model.Plan(200, batch=1, max_unavailable=1, gating="none"), steps)
    assert serial == pytest.approx(200 * (steps.batch_overhead_s + steps.restart()))
    ramp = model.ramp_plans(200, "per class", runs_per_arm=6, classes=1)
    parallel = model.wall_time_s(ramp["10 % ramp, max_unavailable = batch"], steps)
    canary = steps.batch_overhead_s + steps.restart() + steps.gate(6)
    batches = math.ceil(199 / 20)
    assert parallel == pytest.approx(canary + batches * (steps.batch_overhead_s + steps.restart()))
    assert parallel <= 4 * 3600
