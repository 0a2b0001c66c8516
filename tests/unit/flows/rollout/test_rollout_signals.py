"""No pyinfra outlives its controller (issue 48, case 13): `specdeploy rollout` runs each batch's
pyinfra in a process group of its own, forwards Ctrl-C and SIGTERM to it, waits for it to end the
way pyinfra ends on Ctrl-C (a host's turn is not cut by the controller; a second signal kills the
group), and records the interruption in the progress file; a controller killed outright takes its
pyinfra with it. The real controller runs as a process of its own with its real batch runner; only
`pyinfra` is a stand-in on $PATH, a host's turn a few seconds of sleep that leaves the note the
deploy leaves, stopping after the turn in progress on SIGINT as pyinfra does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.unit import REPO as ROOT

CONTROLLER = """
import json, sys
from specdeploy.flows import rollout

hosts, progress, resume = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3] == "resume"
rollout.inventory_hosts = lambda inventory: [(name, []) for name in hosts]
rollout.fleet_pins = lambda inventory, names: {}
sys.exit(rollout.roll_out("inv.py", "deploys/serve.py", canary_group=None,
                          batches=str(len(hosts)), progress_path=progress, resume=resume))
"""

PYINFRA = """
import fnmatch, json, os, signal, sys, time

hosts, log, turn_s = json.loads(os.environ["FAKE_HOSTS"]), os.environ["FAKE_LOG"], 0
stop = []


def say(*words):
    with open(log, "a") as out:
        out.write(" ".join(str(w) for w in words) + "\\n")


def interrupted(signum, frame):
    say("got", signal.Signals(signum).name)
    if os.environ.get("FAKE_ON_SIGINT") != "ignore":
        stop.append(signum)


signal.signal(signal.SIGINT, interrupted)
words = [sys.argv[i + 1] for i, w in enumerate(sys.argv) if w == "--limit"]
batch = [h for w in words for h in hosts if fnmatch.fnmatchcase(h, w)]
say("start", os.getpid(), os.getpgid(0), " ".join(batch))
for name in batch:
    if stop:
        break
    say("turn", name)
    deadline = time.monotonic() + float(os.environ["FAKE_TURN_S"])
    while time.monotonic() < deadline:
        time.sleep(0.05)
    path = os.path.join(os.environ["SPECDEPLOY_ROLLOUT_REPORT"], name + ".json")
    with open(path, "w") as out:
        json.dump({"host": name, "done": True}, out)
    say("turned", name)
if stop:
    say("exit on SIGINT")  # pyinfra: "Exiting upon user request!", exit 0
sys.exit(0)
"""


def alive(pid: int) -> bool:
    """A process that runs (a zombie nobody reaped does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class Rollout:
    """The controller as a process of its own, its own process group (a terminal's foreground
    job: Ctrl-C goes to the whole group), with the stand-in pyinfra first on $PATH."""

    def __init__(self, tmp_path: Path, hosts: list[str], turn_s: float, on_sigint: str = "finish"):
        self.tmp, self.hosts = tmp_path, hosts
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        fake = bin_dir / "pyinfra"
        fake.write_text(f"#!{sys.executable}\n" + textwrap.dedent(PYINFRA))
        fake.chmod(0o755)
        (tmp_path / "controller.py").write_text(CONTROLLER)
        self.starts = 0
        self.progress = tmp_path / "progress.json"
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "PYTHONPATH": str(ROOT),
            "FAKE_HOSTS": json.dumps(hosts),
            "FAKE_TURN_S": str(turn_s),
            "FAKE_ON_SIGINT": on_sigint,
        }

    def start(self, resume: bool = False) -> subprocess.Popen:
        """The controller; a resume's turns are short (only which hosts run counts then)."""
        self.starts += 1  # each run's pyinfra logs to a file of its own
        self.log = self.tmp / f"pyinfra-{self.starts}.log"
        self.env["FAKE_LOG"] = str(self.log)
        if resume:
            self.env["FAKE_TURN_S"] = "0.1"
        self.controller = subprocess.Popen(
            [sys.executable, str(self.tmp / "controller.py"), json.dumps(self.hosts),
             str(self.progress), "resume" if resume else "new"],
            env=self.env, start_new_session=True, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        return self.controller

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def wait_for(self, line: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while line not in self.lines():
            assert time.monotonic() < deadline, f"no {line!r} in {self.lines()}"
            assert self.controller.poll() is None, self.controller.communicate()[0]
            time.sleep(0.05)

    def pyinfra(self) -> tuple[int, int]:
        """(pid, process group) of the batch's stand-in pyinfra, as it wrote them."""
        words = next(line for line in self.lines() if line.startswith("start ")).split()
        return int(words[1]), int(words[2])

    def finish(self, timeout: float = 30) -> tuple[int, str]:
        out, _ = self.controller.communicate(timeout=timeout)
        return self.controller.returncode, out

    def state(self) -> dict:
        return json.loads(self.progress.read_text())


@pytest.fixture
def kill_leftovers():
    """Whatever a failing test leaves running is ended (by its pid) when the test ends."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("how", ["Ctrl-C", "SIGTERM"])
def test_an_interrupted_batch_ends_its_hosts_turn_and_is_recorded(tmp_path, how, kill_leftovers):
    rollout = Rollout(tmp_path, ["h1", "h2"], turn_s=1)
    controller = rollout.start()
    kill_leftovers.append(controller.pid)
    rollout.wait_for("turn h1")
    pid, group = rollout.pyinfra()
    kill_leftovers.append(pid)
    assert group != os.getpgid(controller.pid)  # a process group of its own
    if how == "Ctrl-C":
        os.killpg(controller.pid, signal.SIGINT)  # the terminal signals its foreground job
    else:
        os.kill(controller.pid, signal.SIGTERM)  # a service manager stops the controller
    code, out = rollout.finish()
    assert not alive(pid), "pyinfra outlived its controller"
    said = rollout.lines()
    assert said[-3:] == ["got SIGINT", "turned h1", "exit on SIGINT"], said  # the turn ended
    assert code == {"Ctrl-C": 130, "SIGTERM": 143}[how], out
    name = {"Ctrl-C": "SIGINT", "SIGTERM": "SIGTERM"}[how]
    state = rollout.state()
    assert state["state"]["h1"]["state"] == "done" and state["state"]["h2"]["state"] == "pending"
    assert state["log"][-1]["interrupted"] == name and name in state["stopped"]
    assert state["running"] is None and not state["finished"]
    assert f"interrupted by {name}" in out and "--resume" in out
    controller = rollout.start(resume=True)  # nothing of the old run is left in its way
    code, out = rollout.finish()
    assert code == 0, out
    assert rollout.pyinfra()[0] != pid and "turn h1" not in rollout.lines()  # h1 is finished
    assert rollout.state()["finished"] is True


def test_a_second_interruption_kills_a_pyinfra_that_does_not_stop(tmp_path, kill_leftovers):
    rollout = Rollout(tmp_path, ["h1", "h2"], turn_s=60, on_sigint="ignore")
    controller = rollout.start()
    kill_leftovers.append(controller.pid)
    rollout.wait_for("turn h1")
    pid, _ = rollout.pyinfra()
    kill_leftovers.append(pid)
    os.killpg(controller.pid, signal.SIGINT)
    rollout.wait_for("got SIGINT")
    time.sleep(0.5)
    assert alive(pid) and controller.poll() is None  # still waiting for its turn to end
    os.killpg(controller.pid, signal.SIGINT)
    code, out = rollout.finish()
    assert code == 130 and not alive(pid), out
    assert "turned h1" not in rollout.lines()  # killed in its turn, as asked twice
    state = rollout.state()
    assert state["state"]["h1"]["state"] == "pending" and state["log"][-1]["interrupted"]
    assert "killed" in out


def test_a_controller_killed_outright_takes_its_pyinfra_with_it(tmp_path, kill_leftovers):
    rollout = Rollout(tmp_path, ["h1", "h2"], turn_s=3)
    controller = rollout.start()
    kill_leftovers.append(controller.pid)
    rollout.wait_for("turn h1")
    pid, _ = rollout.pyinfra()
    kill_leftovers.append(pid)
    os.kill(controller.pid, signal.SIGKILL)  # no handler runs: the kernel tells pyinfra
    controller.wait()  # (its output pipe stays open while its pyinfra runs)
    first = rollout.log
    state = rollout.state()  # what happened: a batch was running when the controller died
    assert state["running"]["hosts"] == ["h1", "h2"] and state["running"]["pid"] == controller.pid
    assert state["running"]["pyinfra_pid"] == pid
    controller = rollout.start(resume=True)  # at once: its pyinfra still ends its turn
    kill_leftovers.append(controller.pid)
    code, out = rollout.finish()
    assert code == 0 and "died during batch 1" in out, out
    assert f"waiting for its pyinfra (pid {pid}) to end" in out
    assert not alive(pid), "pyinfra outlived its controller"
    assert first.read_text().splitlines()[-3:] == ["got SIGINT", "turned h1", "exit on SIGINT"]
    assert rollout.state()["finished"] is True


REAL_DEPLOY = """
import time
from pyinfra.operations import python, server

def turn():
    open("turn-began", "w").close()
    time.sleep(2)
    open("turn-ended", "w").close()

python.call(name="a host's turn", function=turn)
server.shell(name="the deploy's next operation", commands=["touch next-operation-ran"])
"""

REAL_CONTROLLER = """
import sys
from specdeploy.flows import rollout

rollout.fleet_pins = lambda inventory, names: {}
sys.exit(rollout.roll_out("inventory.py", "deploy.py", canary_group=None,
                          progress_path="progress.json"))
"""


def test_the_real_pyinfra_ends_its_operation_on_the_forwarded_ctrl_c_and_runs_no_other(tmp_path):
    """What the stand-in above assumes of pyinfra, shown with pyinfra itself on @local: sent
    SIGINT by its controller, it ends the operation in progress (a host's turn is one), runs no
    further one and exits 0; the controller records the host as still to do."""
    (tmp_path / "inventory.py").write_text('hosts = ["@local"]\n')
    (tmp_path / "deploy.py").write_text(REAL_DEPLOY)
    (tmp_path / "controller.py").write_text(REAL_CONTROLLER)
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # fmt: skip
    controller = subprocess.Popen([sys.executable, "controller.py"], cwd=tmp_path, env=env,
                                  start_new_session=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "turn-began").exists():
            assert time.monotonic() < deadline and controller.poll() is None
            time.sleep(0.05)
        pid = json.loads((tmp_path / "progress.json").read_text())["running"]["pyinfra_pid"]
        os.killpg(controller.pid, signal.SIGINT)  # Ctrl-C at the terminal
        out, _ = controller.communicate(timeout=60)
    finally:
        if controller.poll() is None:
            controller.kill()
    assert controller.returncode == 130, out
    assert not alive(pid)
    assert (tmp_path / "turn-ended").exists() and not (tmp_path / "next-operation-ran").exists()
    state = json.loads((tmp_path / "progress.json").read_text())
    assert state["state"]["@local"]["state"] == "pending"
    assert state["log"][-1]["interrupted"] == "SIGINT" and state["log"][-1]["exit_code"] == 0
    assert "--limit '[@]local'" in out
