"""Every custom fact read the way pyinfra reads it (issue 36, item 8): through pyinfra's own
`get_fact` with a connector that answers with recorded output. pyinfra calls `process()` only when
the command succeeded and printed something; on empty output (and on a command that failed, where
the host is not failed: `specdeploy status`) it returns the fact's `default()`, which is None unless
the fact defines one. So each fact defines its typed default, and the callers take it.

The facts are found by introspection, so a new fact is covered here (and must bring a recorded
output to RECORDED) without anyone remembering to add it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import pytest
from pyinfra.api import Config, FactBase, Inventory, State
from pyinfra.api.facts import get_fact
from pyinfra.connectors.util import CommandOutput, OutputLine

from specdeploy.config.schema import config_from_data
from specdeploy.host.facts import files, haproxy, http, nvidia, system, systemd, vllm

DATA = Path(__file__).parent / "data"


class RecordedConnector:
    """Answers every command with one recorded output, as a connector hands it to pyinfra."""

    def __init__(self, lines: list[str], ok: bool = True):
        self.lines, self.ok, self.commands = lines, ok, []

    def connect(self) -> None:
        pass

    def run_shell_command(self, command, **kwargs):
        self.commands.append(str(command))
        return self.ok, CommandOutput([OutputLine("stdout", line) for line in self.lines])


def pyinfra_host(lines: list[str], ok: bool = True):
    """A host of a real pyinfra State whose commands print `lines` (and exit 0 when `ok`)."""
    inventory = Inventory((["h1"], {}))
    State(inventory, Config())
    host = inventory.get_host("h1")
    host.connector = RecordedConnector(lines, ok)
    return host


class Recorded(NamedTuple):
    kwargs: dict
    output: list[str]  # a real host's output: process() gets it
    keys: tuple[str, ...] = ()  # a dict value's keys that callers index, so the default has them


def _nvidia_smi(name: str) -> list[str]:
    return json.loads((DATA / "nvidia-smi-h200" / name).read_text())["output"]


def _snapshot() -> list[str]:
    snapshots = json.loads((DATA / "nvidia-smi-h200" / "model_facts.json").read_text())
    return [json.dumps(next(iter(snapshots.values())))]


RECORDED = {
    vllm.VllmVersion: Recorded({"venv": "/opt/v", "package": "vllm"}, ["0.32.0"]),
    vllm.ModelSnapshot: Recorded(
        {"hf_home": "/hf", "repo": "o/m", "revision": "main"}, _snapshot()
    ),
    nvidia.Accelerators: Recorded({}, _nvidia_smi("device_idle.json")),
    nvidia.CudaBoot: Recorded({}, ["@@unit nvidia-persistenced.service", "@@modprobe"]),
    system.FreeDiskBytes: Recorded(
        {"path": "/opt"}, ["/dev/vda        263174212 36257200 215541792      15% /"]
    ),
    system.MemoryBytes: Recorded(
        {}, ["MemTotal:       24576000 kB", "MemAvailable:   20000000 kB"], ("total", "available")
    ),
    files.JsonFile: Recorded({"path": "/r.json"}, ['{"role": "speculative"}']),
    files.FileText: Recorded({"path": "/u.service"}, ["[Unit]", "Description=vLLM"]),
    systemd.ServiceActive: Recorded({"unit": "u.service"}, ["active"]),
    systemd.ServiceShow: Recorded({"unit": "u.service"}, ["ActiveState=active", "Uptime=100.5"]),
    http.HttpGet: Recorded(
        {"url": "http://127.0.0.1:8000/health"},
        ["ok", "specdeploy-status-curl 200", "specdeploy-status-curl-exit 0"],
        ("exit", "http", "body"),
    ),
    files.FileSha1: Recorded({"path": "/etc/e.env"}, ["0beec7b5ea3f0fdbc95d0dd47f3c5bc275da8a33"]),
    nvidia.GpuMemory: Recorded({}, _nvidia_smi("device_idle.json")),
    haproxy.BalancerServers: Recorded(
        {"socket": "/run/haproxy.sock"},
        (DATA / "haproxy-2.6" / "both_up.csv").read_text().splitlines() + ["@@rc 0"],
        ("status", "servers"),
    ),
}

# Facts whose None is a value of their own, which every caller handles: "not there".
NONE_MEANS_ABSENT = {vllm.VllmVersion, vllm.ModelSnapshot, files.JsonFile, files.FileText}


def custom_facts() -> list[type[FactBase]]:
    """Every fact (a FactBase subclass with a command) defined in specdeploy's fact modules."""
    found = {
        value
        for module in (files, haproxy, http, nvidia, system, systemd, vllm)
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, FactBase)
        and value.__module__ == module.__name__
        and hasattr(value, "command")  # not a base such as base.Fact
    }
    return sorted(found, key=lambda cls: cls.__name__)


def test_the_facts_are_found():
    assert {nvidia.CudaBoot, nvidia.Accelerators, haproxy.BalancerServers} <= set(custom_facts())


@pytest.mark.parametrize("fact", custom_facts(), ids=lambda cls: cls.__name__)
def test_empty_output_reads_as_the_facts_typed_default(fact):
    assert fact in RECORDED, f"{fact.__name__}: add a recorded output to RECORDED"
    kwargs, output, keys = RECORDED[fact]
    host = pyinfra_host([])
    value = host.get_fact(fact, **kwargs)
    assert host.connector.commands == [fact().command(**kwargs)]
    assert value == fact().default()
    real = fact().process(output)
    assert pyinfra_host(output).get_fact(fact, **kwargs) == real  # real output: as before
    if value is None:
        assert fact in NONE_MEANS_ABSENT and real is not None
        return
    assert type(value) is type(real)
    for key in keys:
        assert key in value and key in real
    if isinstance(value, dict | list) or hasattr(value, "model_dump"):
        assert fact().default() is not fact().default()  # callers may change it: never shared


@pytest.mark.parametrize("fact", custom_facts(), ids=lambda cls: cls.__name__)
def test_a_failed_fact_command_reads_as_the_default_where_the_host_is_not_failed(fact):
    """`specdeploy status` reads facts with apply_failed_hosts=False: a command that failed
    (sudo refused, the host went away) gives the default, not None."""
    host = pyinfra_host(["something went wrong"], ok=False)
    kwargs = RECORDED[fact].kwargs
    value = get_fact(host.state, host, fact, kwargs=kwargs, apply_failed_hosts=False)
    assert value == fact().default() and (value is not None or fact in NONE_MEANS_ABSENT)


# --- the callers take the defaults ----------------------------------------------------------------


def test_plain_cuda_host_renders_its_unit_through_pyinfra(valid_data):
    """The recorded H200 container has no persistenced, fabricmanager or nvidia-modprobe: the
    fact's command prints nothing, pyinfra returns the default, and the unit renders (ordered
    after persistenced only), as from the recorded fact."""
    from pyinfra.context import ctx_host

    from specdeploy.host.facts.nvidia import CudaBootInfo
    from specdeploy.render.units import render_unit

    recorded = json.loads((DATA / "cuda-boot" / "h200-device-container.json").read_text())
    assert recorded["output"] == []
    cfg = config_from_data(valid_data)
    host = pyinfra_host(recorded["output"])
    with ctx_host.use(host):
        text = render_unit(cfg).text
    assert host.connector.commands == [recorded["command"]]
    assert text == render_unit(cfg, cuda_boot=CudaBootInfo(**recorded["fact"])).text
    assert "nvidia-persistenced.service" in text and "ExecStartPre" not in text


def test_the_deploys_checks_refuse_on_the_defaults(valid_data):
    """No GPU answer and no disk answer are refusals with a reason, not crashes."""
    from specdeploy.checks.gpus import check_gpus
    from specdeploy.steps.install import venv_disk_problem

    cfg = config_from_data(valid_data)
    assert cfg.vllm_package == "vllm"  # the CUDA build, which reads the GPUs
    problems = check_gpus(cfg, nvidia.Accelerators().default(), None).problems
    assert problems and "printed nothing" in problems[0]
    assert "0.0 GB free" in venv_disk_problem(cfg, system.FreeDiskBytes().default())


def test_status_reads_the_defaults_where_a_host_printed_nothing():
    """`specdeploy status` takes each fact as pyinfra returns it: a value it can show."""
    from specdeploy.observe.status import HostProbe

    host = pyinfra_host([])
    probe = HostProbe(host.state, host, interval=1.0)
    got = probe.fact(http.HttpGet, url="http://127.0.0.1:1/health")
    assert got["exit"] is None and got["http"] is None and got["body"]
    assert probe.fact(systemd.ServiceShow, unit="u.service").get("ActiveState") is None
    assert probe.fact(nvidia.GpuMemory) == []
    assert probe.fact(files.FileSha1, path="/etc/e.env") == "unreadable"
    stat = probe.fact(haproxy.BalancerServers, socket="/run/haproxy.sock")
    assert stat["status"] == "failed" and stat["servers"] == {} and stat["error"]
