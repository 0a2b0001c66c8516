"""Every custom fact read the way pyinfra reads it (issue 36, item 8): through pyinfra's own
`get_fact` with a connector that answers with recorded output. pyinfra calls `process()` only when
the command succeeded and printed something; on empty output (and on a command that failed, where
the host is not failed: `specdeploy status`) it returns the fact's `default()`, which is None unless
the fact defines one. So each fact defines its typed default, and the callers take it.

The facts are found by introspection, so a new fact is covered here (with its arguments and a
host's output from its fixtures in tests/facts/) without anyone remembering to add it."""

from __future__ import annotations

import pytest
from pydantic import BaseModel
from pyinfra.api import Config, FactBase, Inventory, State
from pyinfra.api.facts import get_fact
from pyinfra.connectors.util import CommandOutput, OutputLine

from specdeploy.config.schema import config_from_data
from specdeploy.host.facts import files, haproxy, http, nvidia, system, systemd, vllm
from tests.facts import all_fixtures, cases, fact_classes, fixture


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


def recorded(fact: type[FactBase]) -> dict:
    """The fact's first fixture (tests/facts/) whose output says something and whose value is not
    None: its arguments and a host's output."""
    for case in cases(fact.__name__):
        data = fixture(fact.__name__, case)
        if any(line.strip() for line in data["output"]) and data["fact"] is not None:
            return data
    raise AssertionError(f"{fact.__name__}: add a fixture with output to tests/facts/")


# Facts whose None is a value of their own, which every caller handles: "not there".
NONE_MEANS_ABSENT = {vllm.VllmVersion, vllm.ModelSnapshot, files.JsonFile, files.FileText}
NONE_MEANS_ABSENT |= {vllm.PythonVersion}  # no python3 yet: pip decides (steps/install.py)


FACTS = list(fact_classes().values())  # found by introspection: a new fact is covered


def test_the_facts_are_found():
    assert {nvidia.CudaBoot, nvidia.Accelerators, haproxy.BalancerServers} <= set(FACTS)


@pytest.mark.parametrize("fact", FACTS, ids=lambda cls: cls.__name__)
def test_empty_output_reads_as_the_facts_typed_default(fact):
    data = recorded(fact)
    kwargs, output = data["arg"], data["output"]
    host = pyinfra_host([])
    value = host.get_fact(fact, **kwargs)
    assert host.connector.commands == [fact().command(**kwargs)]
    assert value == fact().default()
    real = fact().process(output)
    assert pyinfra_host(output).get_fact(fact, **kwargs) == real  # real output: as before
    if value is None:
        assert fact in NONE_MEANS_ABSENT and real is not None
        return
    assert type(value) is type(real)  # its whole value: the fixture with no output (tests/facts)
    if isinstance(value, dict | list) or hasattr(value, "model_dump"):
        assert fact().default() is not fact().default()  # callers may change it: never shared


@pytest.mark.parametrize("name, case", all_fixtures(), ids=[f"{n}/{c}" for n, c in all_fixtures()])
def test_every_fixture_reads_the_same_through_pyinfra(name, case):
    data = fixture(name, case)
    value = pyinfra_host(data["output"]).get_fact(fact_classes()[name], **data["arg"])
    assert (value.model_dump(mode="json") if isinstance(value, BaseModel) else value) == data[
        "fact"
    ]


@pytest.mark.parametrize("fact", FACTS, ids=lambda cls: cls.__name__)
def test_a_failed_fact_command_reads_as_the_default_where_the_host_is_not_failed(fact):
    """`specdeploy status` reads facts with apply_failed_hosts=False: a command that failed
    (sudo refused, the host went away) gives the default, not None."""
    host = pyinfra_host(["something went wrong"], ok=False)
    kwargs = recorded(fact)["arg"]
    value = get_fact(host.state, host, fact, kwargs=kwargs, apply_failed_hosts=False)
    assert value == fact().default() and (value is not None or fact in NONE_MEANS_ABSENT)


# --- the callers take the defaults ----------------------------------------------------------------


def test_plain_cuda_host_renders_its_unit_through_pyinfra(valid_data):
    """The recorded H200 container has no persistenced, fabricmanager or nvidia-modprobe: the
    fact's command prints nothing, pyinfra returns the default, and the unit renders (ordered
    after persistenced only), as from the recorded fact."""
    from pyinfra.context import ctx_host

    from specdeploy.host.facts.cuda_boot import CudaBootInfo
    from specdeploy.render.units import render_unit
    from specdeploy.steps.unit import cuda_boot

    recorded = fixture("CudaBoot", "h200_device_container")
    assert recorded["output"] == []
    cfg = config_from_data(valid_data)
    host = pyinfra_host(recorded["output"])
    with ctx_host.use(host):  # the step reads the fact, the renderer takes it
        text = render_unit(cfg, cuda_boot=cuda_boot(cfg)).text
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
