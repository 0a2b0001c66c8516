"""A fleet of STAND-IN hosts for the control node's own work: the real serve deploy planned and
executed against N hosts on a fake connector, counting what each host is sent and how often the
fleet-wide work runs (issue 37). tests/unit/flows/test_fleet_scale.py holds the counts on 20 hosts;
benchmarks/fleet_scale/plan_fleet.py prints the time and memory of 100 to 1,000.

`StandInConnector` is a named STAND-IN for SSH hosts: nothing is connected to. Every host answers
each command from one table built from the recorded outputs in tests/facts/<Fact>/<case>.json (the
outputs real sandbox hosts gave), keyed by the exact command; a command the table lacks answers
empty, as a fresh host would. With a recording of a settled host (record_settled.py), each host
answers as that host did, with its host data: a no-op run. The figures are therefore the control
node's own cost: pyinfra's State, fact gathering through the connector, specdeploy's checks and
planning, and the execution of what was planned — not SSH round trips or anything a host does.
"""

from __future__ import annotations

import json
import re
import resource
import time
from collections import Counter
from pathlib import Path

from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import StringCommand
from pyinfra.api.connect import connect_all
from pyinfra.api.deploy import add_deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operations import run_ops
from pyinfra.connectors.base import BaseConnector
from pyinfra.connectors.util import CommandOutput, OutputLine

FACT_FIXTURES = Path(__file__).resolve().parent / "facts"


# Recorded as parser cases, not as a host's state: the JsonFile cases hold a partial record, which
# a deploy rightly refuses to read; without them the record reads as absent (a fresh host).
SKIPPED_FACTS = {"JsonFile"}


# pyinfra's own facts a Debian host answers (not specdeploy's facts, so no fixture records them).
DEBIAN_ANSWERS = {
    "uname -s": ["Linux"],
    "cat /etc/group": ["root:x:0:", "vllm:x:998:"],
    "command -v useradd || true": ["/usr/sbin/useradd"],
    "cat /etc/passwd": [
        "root:x:0:0:root:/root:/bin/bash",
        "vllm:x:998:998::/nonexistent:/bin/false",
    ],
}


# Asked of several paths while the fixtures record one: free disk is free disk anywhere.
ANSWER_BY_TOOL = ["df -Pk"]


def recorded_answers() -> dict[str, list[str]]:
    """{command: stdout lines} from every recorded fact output (the first recording wins)."""
    table: dict[str, list[str]] = dict(DEBIAN_ANSWERS)
    for path in sorted(FACT_FIXTURES.glob("*/*.json")):
        if path.parent.name in SKIPPED_FACTS:
            continue
        case = json.loads(path.read_text())
        command, output = case.get("command"), case.get("output")
        if isinstance(command, str) and isinstance(output, list):
            table.setdefault(command, [str(line) for line in output])
    return table


class StandInConnector(BaseConnector):
    """A STAND-IN for an SSH host (see the module docstring): answers from `answers`, counts."""

    handles_execution = True
    answers: dict[str, list[str]] = {}
    by_tool: list[tuple[str, list[str]]] = []
    settled: dict[str, dict] = {}  # normal(command) -> {ok, stdout}: record_settled.py's recording
    unanswered: Counter[str] = Counter()

    def __init__(self, state, host):
        super().__init__(state, host)
        self.commands: Counter[str] = Counter()  # phase -> commands run

    @staticmethod
    def make_names_data(name: str):
        yield name, {}, []

    def connect(self) -> None:
        pass

    def run_shell_command(self, command, print_output=False, print_input=False, **arguments):
        phase = "execution" if self.state.is_executing else "planning"
        self.commands[phase] += 1
        text = command.get_raw_value() if isinstance(command, StringCommand) else str(command)
        if self.settled:  # a settled host's recorded answers (record_settled.py)
            entry = self.settled.get(normal(text, self.host.name))
            if entry is None:
                self.unanswered[normal(text, self.host.name)] += 1
                return True, CommandOutput([])
            lines = [line.replace("{host}", self.host.name) for line in entry["stdout"]]
            return entry["ok"], CommandOutput([OutputLine("stdout", line) for line in lines])
        lines = self.answers.get(text)
        if lines is None:  # the same tool asked about another path: answered as it was recorded
            lines = next((out for part, out in self.by_tool if part in text), [])
        return True, CommandOutput([OutputLine("stdout", line) for line in lines])

    def put_file(self, filename_or_io, remote_filename, **kwargs) -> bool:
        self.commands["execution" if self.state.is_executing else "planning"] += 1
        return True

    def get_file(self, remote_filename, filename_or_io, **kwargs) -> bool:
        self.commands["execution" if self.state.is_executing else "planning"] += 1
        return True


def fleet(count: int, data: dict) -> State:
    names = [f"fake-{i:04d}" for i in range(count)]
    state = State(Inventory((names, data)), Config())
    for host in state.inventory:
        host.connector = StandInConnector(state, host)
        state.activate_host(host)
    connect_all(state)
    return state


def host_data() -> dict:
    """One host data for the whole fleet: the unit tests' valid data, its revisions pinned to
    commits (a moving ref would ask the Hub, which this benchmark must not reach)."""
    from tests.unit.conftest import VALID

    commit = "0123456789abcdef0123456789abcdef01234567"
    data = json.loads(json.dumps(VALID))
    data["target_revision"] = commit
    data["speculative_config"]["revision"] = commit
    return data


def once_per_fleet() -> dict[str, int]:
    """How often the fleet-wide work really ran (cache misses) in this process so far."""
    from specdeploy.checks import request_set
    from specdeploy.releases import capabilities

    return {
        "release table reads": capabilities._tables.cache_info().misses,
        "request set tokenizings": request_set._rows_over_limit.cache_info().misses,
    }


def normal(text: str, host: str) -> str:
    """A command or output line as a recording stores it (benchmarks/fleet_scale/
    record_settled.py): the host's name `{host}`, digit runs `#`, so a stand-in of another name
    finds it."""
    return re.sub(r"\d+", "#", text.replace(host, "{host}"))


def measure(count: int, settled: Path | None = None) -> dict:
    """Plan the serve deploy on `count` stand-in hosts, then execute what was planned. `settled`:
    every host answers as the recorded settled sandbox host did, with its host data (a no-op)."""
    from specdeploy.flows import serve

    data = host_data()
    if settled is not None:
        recording = json.loads(Path(settled).read_text())
        StandInConnector.settled, data = recording["answers"], recording["data"]

    if not StandInConnector.answers:
        StandInConnector.answers = recorded_answers()
        StandInConnector.by_tool = [
            (
                tool,
                next(out for cmd, out in StandInConnector.answers.items() if tool in cmd and out),
            )
            for tool in ANSWER_BY_TOOL
        ]
    state = fleet(count, data)
    started = time.perf_counter()
    add_deploy(state, serve.serve)
    planned = time.perf_counter()
    planned_commands = {h.name: h.connector.commands["planning"] for h in state.inventory}
    try:
        run_ops(state)
        execution_error = None
    except PyinfraError as error:  # every stand-in host failed: see the module docstring
        execution_error = str(error)
    executed = time.perf_counter()
    executed_commands = {h.name: h.connector.commands["execution"] for h in state.inventory}
    return {
        "hosts": count,
        "planning_s": planned - started,
        "execution_s": executed - planned,
        "execution_error": execution_error,
        "failed_hosts": len(state.failed_hosts),
        "changed_operations": sum(
            1
            for h in state.inventory
            for op in state.ops[h].values()
            if op.operation_meta.is_complete() and op.operation_meta.did_change()
        ),
        "unanswered_commands": dict(StandInConnector.unanswered),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "planning_commands": planned_commands,
        "execution_commands": executed_commands,
        **once_per_fleet(),
    }
