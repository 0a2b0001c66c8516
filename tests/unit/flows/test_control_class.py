"""A control class of plain hosts (host data `speculation_control = {share = ...}` on hosts without
`instances`, serving the same target and draft): the serve deploy, planned through pyinfra's own
`add_deploy` on a real State of the whole inventory (tests/unit/flows/test_inputs_handed_down.py's
fresh hosts), plans its control hosts on the baseline unit, as a box plans its control instances;
the same hosts whatever --limit picks; a fall-back keeps one speculative host; a class the checks
refuse stops the run before any host is planned."""

from __future__ import annotations

import pytest
from pyinfra import host as current_host
from pyinfra.api import Config, Inventory, State
from pyinfra.api.deploy import add_deploy
from pyinfra.context import ctx_host, ctx_state

from specdeploy.config.problems import ConfigError
from specdeploy.config.schema import config_from_data
from specdeploy.flows import serve
from specdeploy.render import control
from tests.unit.flows.test_inputs_handed_down import BOX, FreshHost

CLASS = {**BOX, "instances": None, "speculation_control": {"share": 0.25}}
HOSTS = [f"gpu-{i}" for i in range(4)]


@pytest.fixture(autouse=True)
def pyinfra_context():
    """pyinfra's context managers set no `finally` (tests/unit/flows/test_fail_alone.py)."""
    before = ctx_host.get(), ctx_state.get()
    yield
    ctx_host.set(before[0]), ctx_state.set(before[1])


@pytest.fixture
def planned(monkeypatch):
    """{host: the role serve planned its server with}, the real plan_server called."""
    roles: dict[str, str] = {}
    real = serve.plan_server

    def plan(member, role, servers):
        roles[current_host.name] = role
        return real(member, role, servers)

    monkeypatch.setattr(serve, "plan_server", plan)
    return roles


def plan(hosts: dict[str, dict], limit: list[str] | None = None) -> State:
    state = State(Inventory((list(hosts.items()), {})), Config())
    for h in state.inventory:
        h.connector = FreshHost()
        state.activate_host(h)
    chosen = [state.inventory.get_host(n) for n in (limit or hosts)]
    add_deploy(state, serve.serve, host=chosen)
    return state


def test_the_control_hosts_are_planned_on_the_baseline(planned, caplog):
    state = plan({name: CLASS for name in HOSTS})
    assert state.failed_hosts == set()
    held = control.control_instances(config_from_data(CLASS), HOSTS)
    assert len(held) == 1  # 0.25 of 4
    assert planned == {h: "baseline" if h in held else "speculative" for h in HOSTS}
    units = config_from_data(CLASS).unit_names
    for h in HOSTS:  # the unit each fresh host is planned to install (steps/unit.py says it)
        unit = units["baseline" if h in held else "speculative"]
        assert f"[{h}] {unit} is not installed yet" in caplog.text


def test_a_limit_plans_the_same_arms_and_a_fall_back_keeps_one_speculative(planned, monkeypatch):
    everyone = {name: CLASS for name in HOSTS} | {"other": {**CLASS, "speculation_control": None}}
    plan(everyone)
    whole = dict(planned)
    assert whole["other"] == "speculative"  # no control arm: in no class
    planned.clear()
    plan(everyone, limit=HOSTS[1:2])  # one host of the class at a time, as the rollout runs it
    assert planned == {HOSTS[1]: whole[HOSTS[1]]}
    planned.clear()
    monkeypatch.setenv(control.FALLBACK_ENV, "1")
    plan({name: CLASS for name in HOSTS})
    (kept,) = [h for h, role in planned.items() if role == "speculative"]
    assert kept == control.ranked_hosts(HOSTS)[0]


def test_a_refused_class_stops_the_run_before_any_host(planned):
    mixed = {name: CLASS for name in HOSTS} | {"gpu-9": {**CLASS, "live_windows": 8}}
    with pytest.raises(ConfigError, match="live_windows: class class-Qwen3-8B-"):
        plan(mixed)
    assert planned == {}
    with pytest.raises(ConfigError, match="no host is left for the other arm"):
        plan({"alone": CLASS})
