"""What a whole box (host data `instances`) must look like beyond each instance's own server checks
(test_deployed_host.py runs those once per instance, `host/N`): each instance on its own devices,
and the balancer on vllm_port in front of all of them. Every expectation comes from the host's
config, split into instances by specdeploy.render.instances as the deploy split it."""

from __future__ import annotations

import re
import shlex

import pytest

from specdeploy.host.facts.haproxy import BalancerServers
from specdeploy.render import instances
from specdeploy.render.units import render_balancer, render_unit
from tests.host.test_deployed_host import curl, run


def test_instance_runs_on_its_own_devices(th, instance):
    if instance is None:
        pytest.skip("one server on this host: no instances")
    unit = render_unit(instance.cfg).name
    pid = run(th, f"systemctl show -p MainPID --value {unit}").strip()
    assert pid not in ("", "0"), f"{unit} is not running"
    environ = run(th, f"tr '\\0' '\\n' < /proc/{pid}/environ")
    key = instances.CPU_ENV if instance.device_kind == "cpus" else instances.GPU_ENV
    wanted = f"{key}={instance.cfg.vllm_env[key]}"
    assert wanted in environ.splitlines(), f"{unit} (pid {pid}) runs without {wanted}"
    if instance.device_kind == "cpus":  # and systemd pins it there (CPUAffinity=)
        allowed = run(th, f"grep '^Cpus_allowed_list:' /proc/{pid}/status").split()[-1]
        assert instances.parse_cpu_ids(allowed) == list(instance.devices), (
            f"{unit} may run on cores {allowed}, not only its own {instance.devices_text}"
        )


@pytest.fixture(scope="session")
def members(box_layout):
    assert box_layout.problems == [], box_layout.problems
    return box_layout.instances


def test_balancer_unit_and_config(th, box_name, box_cfg, members):
    unit = box_cfg.balancer_unit
    service = th.service(unit)
    assert service.is_enabled and service.is_running, f"{unit} is not enabled and running"
    config, rendered = render_balancer(box_cfg, members)
    f = th.file(config.path)
    assert (f.user, f.group, f.mode) == ("root", "root", 0o600), (
        f"{config.path} is {f.user}:{f.group} {oct(f.mode)}, not root:root 0600 (it names the "
        "admin socket)"
    )
    assert f.content_string == config.text, f"{config.path} differs from the host data"
    on_disk = run(th, f"cat {shlex.quote(box_cfg.unit_path(unit))}")
    assert on_disk == rendered.text, f"{unit} differs from the host data"


def test_balancer_lists_every_instance_up(th, box_name, box_cfg, members):
    command = BalancerServers().command(socket=box_cfg.balancer_socket)
    stat = BalancerServers().process(run(th, f"sh -c {shlex.quote(command)}").splitlines())
    assert stat["status"] == "ok", stat
    states = {name: row.get("status") for name, row in stat["servers"].items()}
    assert set(states) == {m.name for m in members}, f"the balancer's servers: {states}"
    assert all(s.split()[0] == "UP" for s in states.values()), f"not all up: {states}"


def test_balancer_answers_on_vllm_port(th, box_name, box_cfg, members):
    through = members[0].cfg.model_copy(update={"vllm_port": box_cfg.vllm_port})  # its API key
    curl(th, through, "/health")
    assert box_cfg.effective_served_name in curl(th, through, "/v1/models")


def test_balancer_exporter_says_every_instance_up(th, box_name, box_cfg, members):
    address = box_cfg.vllm_host if box_cfg.vllm_host not in ("0.0.0.0", "::") else "127.0.0.1"
    url = f"http://{address}:{box_cfg.balancer_metrics_port}/metrics"
    text = run(th, f"curl -sS --fail -m 10 {shlex.quote(url)}")
    for m in members:
        line = re.search(
            rf'^haproxy_server_status\{{proxy="instances",server="{re.escape(m.name)}",'
            rf'state="UP"\}} (\d)',
            text,
            re.M,
        )
        assert line and line.group(1) == "1", f"{url}: {m.name} is not UP"
