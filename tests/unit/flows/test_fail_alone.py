"""One bad host fails alone (issue 37): a host whose own state refuses the deploy while planning
(config/problems.HostRefused: its GPUs, disk, memory, a box's split of its devices) is failed in
pyinfra's state, its cause logged and noted for `specdeploy rollout`, and the other hosts are
planned as if it were not there. The real deploy function runs through pyinfra's own `add_deploy`
on a real State of three hosts; only the host's planning is replaced by what its facts would say."""

from __future__ import annotations

import json
import logging

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.deploy import add_deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import ctx_host, ctx_state

from specdeploy.checks.gpus import PreflightError
from specdeploy.config.problems import ConfigError, HostRefused, Problem
from specdeploy.flows import serve
from specdeploy.report import notes
from specdeploy.steps import rollback


@pytest.fixture(autouse=True)
def pyinfra_context():
    """pyinfra's context managers set no `finally`: a deploy that raises leaves its host and
    state in context, which later tests would read as theirs."""
    before = ctx_host.get(), ctx_state.get()
    yield
    ctx_host.set(before[0]), ctx_state.set(before[1])


def fleet(names):
    state = State(Inventory((names, {})), Config())
    for host in state.inventory:
        state.activate_host(host)
    return state


@pytest.fixture
def planned(monkeypatch):
    """`serve`'s planning per host: refused where `refusals` says, else recorded as planned."""
    seen: list[str] = []
    refusals: dict[str, Exception] = {}

    def plan(inputs, role, started):
        name = rollback.host.name
        if name in refusals:
            raise refusals[name]
        seen.append(name)

    monkeypatch.setattr(serve, "host_inputs", lambda: object())
    monkeypatch.setattr(serve, "_serve", plan)
    return seen, refusals


def test_a_refused_host_fails_alone_and_the_others_are_planned(planned, tmp_path, monkeypatch,
                                                               caplog):  # fmt: skip
    seen, refusals = planned
    refusals["h2"] = PreflightError("h2: preflight: nvidia-smi exited 255: GPU is lost")
    monkeypatch.setenv(notes.ROLLOUT_REPORT_ENV, str(tmp_path))
    state = fleet(["h1", "h2", "h3"])
    with caplog.at_level(logging.ERROR):
        add_deploy(state, serve.serve)
    assert sorted(seen) == ["h1", "h3"]
    assert [h.name for h in state.failed_hosts] == ["h2"]
    assert sorted(h.name for h in state.inventory.get_active_hosts()) == ["h1", "h3"]
    assert "refused, not touched: h2: preflight: nvidia-smi exited 255" in caplog.text
    note = json.loads((tmp_path / "h2.json").read_text())
    assert note["refused"] is True and note["rolled_back"] is False
    assert note["cause"].startswith("h2: preflight: nvidia-smi exited 255")
    # what it serves now, for the rollout's FAILED line
    assert note["after"] == (
        "not touched, refused while planning: still serving what it served before this run"
    )


def test_every_host_state_refusal_is_a_host_refusal():
    # the GPU and memory preflight, a box's split of the host's devices (steps/servers.py), low
    # disk and incomplete weights (steps/weights.py, install.py, preflight.py) raise these
    assert issubclass(PreflightError, HostRefused)
    for module in ("weights", "install", "preflight", "servers"):
        source = serve.__file__.rsplit("/", 2)[0] + f"/steps/{module}.py"
        assert "raise HostRefused(" in open(source).read(), module
        assert 'raise RuntimeError(f"{host.name}: install' not in open(source).read()


def test_invalid_host_data_still_stops_the_run_before_any_host(planned, monkeypatch):
    problem = Problem("h2", "served_model_name", "has a newline", "write it on one line")
    monkeypatch.setattr(serve, "host_inputs", lambda: (_ for _ in ()).throw(
        ConfigError([problem])))  # fmt: skip
    with pytest.raises(ConfigError):
        add_deploy(fleet(["h1", "h2"]), serve.serve)


def test_when_every_host_is_refused_the_run_ends_naming_them(planned):
    seen, refusals = planned
    for name in ("h1", "h2"):
        refusals[name] = HostRefused(f"{name}: only 1.0 GiB free under /var/lib/specdeploy/hf")
    with pytest.raises(PyinfraError, match="No hosts remaining"):
        add_deploy(fleet(["h1", "h2"]), serve.serve)
    assert seen == []
