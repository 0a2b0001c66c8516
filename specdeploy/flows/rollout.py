"""Fleet rollouts that cannot take the fleet down.

* `specdeploy rollout INVENTORY deploys/serve.py --canary-group canary --batches 1,5%,25%,100%`
  runs pyinfra once per batch with `--limit`: the canary group first, then a ramp like Ansible's
  `serial` list (numbers or percentages of the rollout's hosts, the last one repeating, sizes in
  exact arithmetic), in inventory order. Each host's `--limit` word selects that host alone
  (config/inventory.exact_host_pattern), never a group or a pattern.
* Each host of a batch leaves a note (report/notes.py): done, failed with its cause (rolled back,
  refused while planning, an operation that failed), or held back (not restarted: a host before it
  failed). A held-back host goes first in the next batch; a failed one counts against the failure
  budget (`--max-fail-percent`, of the rollout's hosts; default 0: the first failure stops the
  rollout). Past the budget, or when a canary fails, the rollout stops; later hosts are untouched.
  Both are checked before every batch, a resume's first too (`stop_reason`): a plain `--resume`
  runs a failed canary again first and nothing else before it passes, and runs no batch past a
  spent budget (`--retry-failed`, or a larger `--max-fail-percent`, answers that).
* A progress file on the control node (`--progress`, default under $XDG_STATE_HOME) records the
  plan (hosts, ramp, pinned revisions) and every host's outcome after each batch, written
  atomically: `--resume` continues a crashed or stopped rollout with the same pins and never puts a
  finished host in a later `--limit` (a batch cut short by a killed controller runs again: its
  finished hosts are a no-op re-run there). The batch in progress is recorded before it starts.
* Each batch's pyinfra runs in a process group of its own: Ctrl-C, SIGTERM and SIGHUP reach the
  controller alone, which forwards the first as SIGINT, waits for pyinfra to end, kills its group
  on a second, and records the interruption (`Interrupts`); a controller killed outright takes
  its pyinfra with it (PR_SET_PDEATHSIG). No pyinfra outlives its controller.
* Inside a deploy (one pyinfra run, one batch), the hosts are restarted one at a time, or
  `max_unavailable` at a time (serve.py); `steps/rollback.py` restores the previous unit when the
  health check fails and holds back the batch's later hosts; `steps/unit.py` prints the argv diff
  while planning.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from specdeploy.checks.host_data import ConfigError, check_config
from specdeploy.config.inventory import (
    exact_host_patterns,
    host_data,
    hosts_with_data,
    limit_hosts,
)
from specdeploy.config.revisions import PINNED_REVISIONS_ENV, RevisionError, pins_for_hosts
from specdeploy.config.timestamps import utc_iso
from specdeploy.report.notes import ROLLOUT_REPORT_ENV, STILL_SERVING, read_notes

PROGRESS_SCHEMA = 2  # 2: max_fail_percent as written (text), the running batch, interruptions
DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
# A failed host whose note does not say what it serves (a deploy that cannot know: compare, tune)
NOT_NOTED = "not rolled back; what it serves now was not noted — `specdeploy status` shows it"

# --------------------------------------------------------------------------------------------------
# The plan: which hosts, in which batches


def inventory_hosts(inventory_path: str, cwd: str | None = None) -> list[tuple[str, list[str]]]:
    """[(host name, [groups])] in inventory order, read without connecting."""
    return [(name, groups) for name, groups, _ in hosts_with_data(inventory_path, cwd=cwd)]


def parse_ramp(spec: str) -> list[int | str]:
    """`1,5%,25%,100%` -> [1, "5%", "25%", "100%"]: batch sizes, as Ansible's `serial` list (a
    percentage stays the text it was given: sizes come from it in exact arithmetic)."""
    steps: list[int | str] = []
    for word in (w.strip() for w in str(spec).split(",")):
        try:
            if word.endswith("%"):
                if not 0 < exact_percent(word[:-1]) <= 100:
                    raise ValueError
                steps.append(word)
            else:
                count = int(word)
                if count < 1:
                    raise ValueError
                steps.append(count)
        except ValueError:
            raise ValueError(
                f"--batches {spec!r}: {word!r} is not a batch size — give whole numbers >= 1 or "
                "percentages in (0, 100], comma-separated, e.g. 1,5%,25%,100%"
            ) from None
    return steps


def exact_percent(value: str | int | float) -> Fraction:
    """A percentage as the decimal it was written as, exactly: `18.4` is 184/10, not the binary
    float 18.39999...; a float given by a caller is read from its shortest text, `str(18.4)`."""
    text = str(value).strip()
    if not DECIMAL.fullmatch(text):  # no nan, inf, 1/3, 1_0
        raise ValueError(f"{value!r} is not a decimal number")
    return Fraction(text)


def share(hosts: int, percent: str | int | float) -> int:
    """`percent` % of `hosts`, rounded down, in exact arithmetic: share(375, "18.4") == 69 (the
    float product 375 * 18.4 / 100 is 68.99999...)."""
    exact = exact_percent(percent) * hosts
    return exact.numerator // (exact.denominator * 100)


def batch_size(step: int | str, hosts_in_rollout: int) -> int:
    """A ramp step's hosts: a number as it is, a percentage of the rollout's hosts (at least 1)."""
    if isinstance(step, int):
        return step
    return max(1, share(hosts_in_rollout, step[:-1]))


def failure_budget(hosts_in_rollout: int, max_fail_percent: str | int | float) -> int:
    """The failed hosts a rollout goes on past: `max_fail_percent` % of its hosts, rounded down."""
    return share(hosts_in_rollout, max_fail_percent)


def shown_percent(percent: str) -> str:
    """A percentage for a message: `10` for 10, 10.0 or 10.00; `18.4` as given."""
    exact = exact_percent(percent)
    return str(exact.numerator) if exact.denominator == 1 else str(percent).strip()


def rollout_order(
    hosts: list[tuple[str, list[str]]],
    canary_group: str | None,
    limit: list[str] | None = None,
    inventory_path: str = "the inventory",
) -> tuple[list[str], list[str]]:
    """(canary hosts, the others) in inventory order; `limit`: host names, groups or patterns, as
    pyinfra's --limit (one that matches nothing is refused: config/inventory.limit_hosts)."""
    names = limit_hosts(hosts, limit, inventory_path)
    canary = [
        name for name, groups in hosts if canary_group and canary_group in groups and name in names
    ]
    if canary_group and not canary:
        which = "no host of the --limit" if limit else "no host of the inventory"
        raise ValueError(
            f"{which} is in the canary group {canary_group!r} — put the hosts to deploy first in "
            f"a group {canary_group!r} of the inventory, name another group with --canary-group "
            "GROUP, or run without a canary: --canary-group ''"
        )
    return canary, [name for name in names if name not in canary]


def plan_batches(
    hosts: list[tuple[str, list[str]]],
    canary_group: str | None,
    batches: str | int,
    limit: list[str] | None = None,
) -> list[list[str]]:
    """Canary group first (one batch), then the ramp over the rest, inventory order (the plan as
    printed; the run re-plans after a batch with held-back hosts)."""
    canary, rest = rollout_order(hosts, canary_group, limit)
    ramp = parse_ramp(str(batches))
    total = len(canary) + len(rest)
    planned = [canary] if canary else []
    step = 0
    while rest:
        size = batch_size_at(ramp, step, total)
        planned.append(rest[:size])
        rest, step = rest[size:], step + 1
    return planned


def fleet_pins(inventory: str, names: list[str]) -> dict[str, str]:
    """Resolve every moving ref of the hosts once, before the first batch (revisions.py); a host
    whose data is invalid or whose ref cannot be resolved stops the rollout before any host."""
    data = host_data(inventory)
    try:
        configs = [check_config(name, data[name]) for name in names]
        return pins_for_hosts(configs)
    except (ConfigError, RevisionError) as error:
        raise ValueError(f"nothing was touched:\n{error}") from None


# --------------------------------------------------------------------------------------------------
# The progress file


class HostProgress(BaseModel):
    state: Literal["pending", "done", "failed"] = "pending"
    cause: str | None = Field(None, description="why it failed: the host's own note")
    after: str | None = Field(None, description="what the host serves after its failure")
    batch: int | None = Field(None, description="the batch (1-based) that settled it")


class BatchLog(BaseModel):
    """One batch as it ran: its hosts, pyinfra's exit code and each host's note as written."""

    hosts: list[str]
    canary: bool = False
    exit_code: int
    notes: dict[str, dict]
    seconds: float
    interrupted: str | None = Field(
        None, description="the signal that interrupted the batch (SIGINT, SIGTERM, SIGHUP)"
    )


class RunningBatch(BaseModel):
    """The batch a controller is running, written before its pyinfra starts and cleared once its
    hosts are settled: a file that still holds it after the controller is gone says the
    controller died during that batch, and a resume beside a live one is refused."""

    batch: int
    hosts: list[str]
    pid: int = Field(description="the controller's process id")
    pid_started: str | None = Field(None, description="its start time (/proc), against pid reuse")
    pyinfra_pid: int | None = Field(None, description="its pyinfra's, once started: its group's")
    pyinfra_started: str | None = None
    machine: str = Field(description="the control node's host name")
    since: str


class Progress(BaseModel):
    """One rollout, as the control node keeps it between batches (and across a crash)."""

    schema_version: int = PROGRESS_SCHEMA
    inventory: str = Field(description="the inventory file, absolute")
    deploy: str
    hosts: list[str] = Field(description="every host of the rollout, canary first")
    canary: list[str]
    batches: str = Field(description="the ramp as given, e.g. 1,5%,25%,100%")
    max_fail_percent: str = Field(description="the failure budget in % of the hosts, as written")
    pins: dict[str, str] = Field(description="moving refs resolved once, for every batch")
    ramp_step: int = Field(0, description="ramp steps used so far (the canary batch is not one)")
    batches_run: int = 0
    started_at: str
    updated_at: str
    stopped: str | None = Field(None, description="why the rollout stopped early, if it did")
    finished: bool = False
    running: RunningBatch | None = Field(None, description="the batch in progress, if one is")
    state: dict[str, HostProgress]
    log: list[BatchLog] = Field(default_factory=list, description="every batch run, in order")

    @field_validator("max_fail_percent", mode="before")
    @classmethod
    def _as_written(cls, value):  # schema 1 wrote a float: its shortest text is what was given
        return str(value) if isinstance(value, int | float) else value

    def named(self, state: str) -> list[str]:
        return [name for name in self.hosts if self.state[name].state == state]


def default_progress_path(inventory: str, deploy: str) -> Path:
    """Under $XDG_STATE_HOME (~/.local/state): one file per inventory and deploy."""
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    key = hashlib.sha256(f"{Path(inventory).resolve()}\0{deploy}".encode()).hexdigest()[:10]
    return base / "specdeploy" / "rollouts" / f"{Path(inventory).stem}-{key}.json"


def write_progress(path: Path, progress: Progress) -> None:
    """Atomically (a new 0600 file renamed over the old), in a directory only its owner opens."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    progress.updated_at = utc_iso()
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(progress.model_dump_json(indent=2))
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)


def read_progress(path: Path) -> Progress | None:
    return Progress.model_validate_json(path.read_text()) if path.exists() else None


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name (state first), None where unread."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_started(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat), None where that cannot
    be read: with the pid it names one process, not a later one given the same pid."""
    fields = proc_stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def still_running(pid: int | None, started: str | None) -> bool:
    """Whether process `pid` of this machine still runs and is the one that started at `started`
    (where that was recorded and can be read). Never this process itself."""
    if pid is None or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    fields = proc_stat(pid)
    if fields and fields[0] in ("Z", "X"):
        return False  # ended; its parent has not reaped it yet
    now = fields[19] if fields and len(fields) > 19 else None
    return started is None or now is None or now == started


def the_last_batch(running: RunningBatch, path: Path, say) -> None:
    """Before a resume: the controller that recorded `running` is gone, or the resume is refused
    (its pyinfra holds the batch's hosts' locks: a resume beside it would count them failed);
    its pyinfra, told to stop when its controller died, is waited for. From another machine
    neither can be told: said, and the hosts' locks stand guard."""
    if running.machine != socket.gethostname():
        say(f"the last batch was recorded by a controller on {running.machine} (pid "
            f"{running.pid}, batch {running.batch} since {running.since}); whether it still runs "
            "cannot be told from here: if it does, stop this resume (its hosts' locks would fail "
            "them here)")  # fmt: skip
        return
    if still_running(running.pid, running.pid_started):
        raise ValueError(
            f"--resume: the controller of {path} still runs (pid {running.pid} on "
            f"{running.machine}, batch {running.batch} since {running.since}): its pyinfra holds "
            f"those hosts' locks — wait for it to end, or stop it (Ctrl-C there, or kill -INT "
            f"{running.pid}) and --resume then"
        )
    say(f"the last controller (pid {running.pid}) died during batch {running.batch} "
        f"[{', '.join(running.hosts)}]: its hosts without an outcome run again (a finished "
        "host's re-run there is a no-op)")  # fmt: skip
    if still_running(running.pyinfra_pid, running.pyinfra_started):
        say(
            f"waiting for its pyinfra (pid {running.pyinfra_pid}) to end: told to stop (SIGINT) "
            "when its controller died, it ends its operation in progress first"
        )
        try:
            while still_running(running.pyinfra_pid, running.pyinfra_started):
                time.sleep(0.5)
        except KeyboardInterrupt:
            raise ValueError(
                f"--resume: stopped while waiting for pyinfra (pid {running.pyinfra_pid}) of the "
                "last controller; nothing was run — --resume again once it has ended"
            ) from None


# --------------------------------------------------------------------------------------------------
# One batch, and what stops it


class Interrupts:
    """SIGINT, SIGTERM and SIGHUP while the controller runs its batches. No batch starts after
    one. While a batch's pyinfra runs (in a process group of its own, so a terminal's Ctrl-C
    reaches the controller alone), the first is forwarded to that group as SIGINT, which pyinfra
    answers as its own Ctrl-C (it stops and exits), and the controller waits for it; a second
    kills the group (SIGKILL). The handler only signals and records: what is said about it is
    said by the waiting loop (`news`)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self.received: list[str] = []
        self.group: int | None = None  # the running pyinfra's process group
        self._before: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for number in self.SIGNALS:
                self._before[number] = signal.signal(number, self.handle)
        return self

    def __exit__(self, *exc):
        for number, handler in self._before.items():
            signal.signal(number, handler)
        self._before.clear()

    @property
    def first(self) -> str | None:
        return self.received[0] if self.received else None

    @property
    def exit_code(self) -> int:
        """128 + the first signal's number, as a shell reports a process it ended."""
        return 128 + int(signal.Signals[self.first])

    def handle(self, number, frame) -> None:
        self.received.append(signal.Signals(number).name)
        self.forward()

    def forward(self) -> None:
        """Pass what was received on to the running pyinfra's process group, if one runs."""
        if self.group is None or not self.received:
            return
        try:
            os.killpg(self.group, signal.SIGINT if len(self.received) == 1 else signal.SIGKILL)
        except ProcessLookupError:
            pass

    def news(self, told: int) -> str | None:
        """What the signals after the first `told` did, for the operator."""
        if len(self.received) <= told:
            return None
        got = self.received[-1]
        if len(self.received) == 1:
            return (
                f"interrupted by {got}: pyinfra (process group {self.group}) was sent SIGINT and "
                "stops as on its own Ctrl-C; waiting for it to end (Ctrl-C again kills it at once "
                "with SIGKILL, mid-turn)"
            )
        return f"{got} again: pyinfra (process group {self.group}) killed (SIGKILL)"


def _die_with_parent() -> None:
    """In the child before pyinfra starts: SIGINT to it when its controller dies, however it dies
    (Linux's PR_SET_PDEATHSIG; elsewhere nothing), so a controller killed outright (SIGKILL, an
    OOM kill) still stops its pyinfra the way Ctrl-C would."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGINT, 0, 0, 0)  # PR_SET_PDEATHSIG


try:
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
except (OSError, AttributeError):
    _PRCTL = None


def run_pyinfra(
    command: list[str],
    env: dict,
    interrupts: Interrupts | None = None,
    say: Callable[[str], None] = lambda text: None,
    started: Callable[[int], None] = lambda pid: None,
) -> int:
    """The real batch: pyinfra in a subprocess (its output goes to the operator's terminal), in a
    session and process group of its own (no terminal signal reaches it but through
    `interrupts`; no prompt can wait on the terminal: its stdin is /dev/null), ended with its
    controller, and waited for to the end however the controller is interrupted. `started`: told
    pyinfra's pid (its process group's) as soon as it runs."""
    child = subprocess.Popen(
        command,
        env=env,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    started(child.pid)
    if interrupts is None:
        try:
            return child.wait()
        except BaseException:
            os.killpg(child.pid, signal.SIGINT)  # not left behind: stopped as on Ctrl-C
            child.wait()
            raise
    interrupts.group = child.pid
    try:
        interrupts.forward()  # a signal that came while it was starting
        told, code = 0, None
        while code is None:
            try:
                code = child.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
            news = interrupts.news(told)
            if news:
                told = len(interrupts.received)
                say(news)
        if interrupts.received:
            try:  # anything pyinfra started and left in its group goes with it
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return code
    finally:
        interrupts.group = None


def run_batch(command: list[str], pins: dict, run: Callable[[list[str], dict], int]):
    """(pyinfra's exit code, the batch's notes by host). The notes' directory is mkdtemp's: 0700
    and a fresh name, never one another user of a shared bastion made or linked first; removed
    once read, however the batch ends."""
    with tempfile.TemporaryDirectory(prefix="specdeploy-rollout-", ignore_cleanup_errors=True) as d:
        env = {**os.environ, ROLLOUT_REPORT_ENV: d, PINNED_REVISIONS_ENV: json.dumps(pins)}
        code = run(command, env)
        return code, read_notes(d)


def settle(
    batch: list[str], code: int, notes: dict[str, dict], interrupted: bool = False
) -> tuple[dict, list[str]]:
    """Each host's outcome from its note: ({host: HostProgress} settled, [held back]). A host
    without a note in a batch pyinfra failed never reached specdeploy's steps (unreachable, or
    pyinfra stopped first): failed, with that said. In an interrupted batch (pyinfra stopped on
    a signal, and exits 0 when it does) a host without a note is held back: not known to be done
    or failed, it runs again."""
    settled, held = {}, []
    for name in batch:
        entry = notes.get(name)
        if entry is None:
            if interrupted:
                held.append(name)
            elif code == 0:
                settled[name] = HostProgress(state="done")
            else:
                settled[name] = HostProgress(
                    state="failed",
                    cause=f"{name}: pyinfra failed it before any specdeploy step noted an outcome "
                    "(unreachable, or a connection or planning error): see pyinfra's output",
                    after="not rolled back (pyinfra failed it before any step noted a change): it "
                    f"should be {STILL_SERVING} — `specdeploy status` confirms",
                )
        elif entry.get("done"):
            settled[name] = HostProgress(state="done")
        elif entry.get("held_back"):
            held.append(name)
        else:
            after = entry.get("after") or NOT_NOTED
            if entry.get("rolled_back"):
                restored = entry.get("restored", "its previous unit and env file")
                after = f"rolled back to {restored}; " + (entry.get("after") or "")
            settled[name] = HostProgress(state="failed", cause=entry.get("cause"), after=after)
    return settled, held


def stop_reason(progress: Progress, budget: int) -> tuple[str, str] | None:
    """Why no further batch may run, checked before every batch (the first of a resume too) and
    at the end: (the stop, what answers it), or None. A canary host that stands failed stops
    every other host; failed hosts past the budget stop every host."""
    failed = progress.named("failed")
    canary = [name for name in failed if name in progress.canary]
    if canary:
        return (
            f"the canary failed ({', '.join(canary)})",
            "fix the cause, then --resume: the failed canary host(s) run again first, and no "
            "other host runs before they pass",
        )
    if len(failed) > budget:
        hosts = len(progress.hosts)
        # the least P, to 0.01, with floor(hosts * P / 100) >= the failed hosts
        least = Fraction(-(-100 * 100 * len(failed) // hosts), 100)
        past = (
            f", or --resume --max-fail-percent {float(least):g} (or more) to go on past them"
            if least < 100
            else ""
        )
        return (
            f"{len(failed)} failed host(s) exceed the failure budget of {budget}",
            "a plain --resume stops here again: fix the cause, then --resume --retry-failed (the "
            f"failed hosts run again first){past}",
        )
    return None


# --------------------------------------------------------------------------------------------------
# The controller: `specdeploy rollout`


def roll_out(
    inventory: str,
    deploy: str,
    *,
    canary_group: str | None = "canary",
    batch_size: int | None = None,
    batches: str | None = None,
    max_fail_percent: str | float | None = None,
    progress_path: str | Path | None = None,
    resume: bool = False,
    retry_failed: bool = False,
    dry: bool = False,
    pyinfra_args: list[str] | None = None,
    limit: list[str] | None = None,
    out=sys.stdout,
    run: Callable[[list[str], dict], int] | None = None,
) -> int:
    """Run pyinfra batch by batch within the failure budget. Returns the exit code: 0 when every
    host is done, 1 when any failed (the budget held or not) or a stop stands, 128 + the signal's
    number when a signal interrupted it (130: Ctrl-C, 143: SIGTERM), 2 for a plan refused before
    any host was touched (ValueError). `max_fail_percent`: None is 0 for a new rollout and the
    recorded budget on --resume; given on --resume, it replaces the recorded one. `run`: the batch
    runner (pyinfra in a subprocess unless a test stands in for it)."""

    def say(text: str) -> None:
        try:
            print(f"specdeploy rollout: {text}", file=out, flush=True)
        except OSError:  # the terminal is gone (SIGHUP): the progress file still says it all
            pass

    if batch_size is not None and batches is not None:
        raise ValueError("give --batches or --batch-size, not both")
    ramp_spec = str(batches if batches is not None else batch_size or 1)
    ramp = parse_ramp(ramp_spec)
    if max_fail_percent is not None:
        try:
            percent = exact_percent(max_fail_percent)
        except ValueError as error:
            raise ValueError(f"--max-fail-percent: {error} — give a number in [0, 100)") from None
        if not 0 <= percent < 100:
            raise ValueError(f"--max-fail-percent {max_fail_percent}: give a number in [0, 100)")
    inventory_groups = inventory_hosts(inventory)
    canary, rest = rollout_order(inventory_groups, canary_group, limit, inventory)
    hosts = canary + rest
    limit_word = dict(zip(hosts, exact_host_patterns(hosts, inventory_groups), strict=True))
    path = Path(progress_path) if progress_path else default_progress_path(inventory, deploy)
    progress = None if dry else read_progress(path)
    if progress is not None and not progress.finished and not resume:
        say(f"an unfinished rollout ({path}: {len(progress.named('done'))} of "
            f"{len(progress.hosts)} host(s) done, updated {progress.updated_at}) is replaced by "
            "this one; --resume would have continued it with its pins")  # fmt: skip
    if resume:
        if progress is None or progress.finished:
            raise ValueError(
                f"--resume: no unfinished rollout in {path} — run without --resume to start one, "
                "or give the progress file of the rollout to resume with --progress FILE"
            )
        if progress.hosts != hosts or progress.deploy != deploy:
            raise ValueError(
                f"--resume: {path} is a rollout of other hosts or another deploy "
                f"({progress.deploy}, {len(progress.hosts)} host(s)); run without --resume to "
                "begin anew"
            )
        if progress.running is not None:
            the_last_batch(progress.running, path, say)
            progress.running = None
        ramp_spec, ramp = progress.batches, parse_ramp(progress.batches)
        pins = progress.pins
        if max_fail_percent is not None and exact_percent(max_fail_percent) != exact_percent(
            progress.max_fail_percent
        ):
            was = progress.max_fail_percent
            progress.max_fail_percent = str(max_fail_percent).strip()
            budget_note = f", was {shown_percent(was)}%"
        else:
            budget_note = ""
        progress.stopped = None
        again = [
            name for name in progress.named("failed") if retry_failed or name in progress.canary
        ]
        for name in again:
            progress.state[name] = HostProgress()
        done, failed, pending = (len(progress.named(s)) for s in ("done", "failed", "pending"))
        say(f"resuming {path}: {done} done, {failed} failed, {pending} to go")
        if again:
            which = "failed" if retry_failed else "failed canary"
            say(f"the {which} host(s) run again first: {', '.join(again)}")
    else:
        pins = fleet_pins(inventory, hosts)
        now = utc_iso()
        percent_text = "0" if max_fail_percent is None else str(max_fail_percent).strip()
        progress = Progress(inventory=str(Path(inventory).resolve()), deploy=deploy, hosts=hosts,
                            canary=canary, batches=ramp_spec, max_fail_percent=percent_text,
                            pins=pins, started_at=now, updated_at=now,
                            state={name: HostProgress() for name in hosts})  # fmt: skip
        budget_note = ""
    for key, sha in sorted(pins.items()):
        say(f"pinned for every batch: {key.split('|', 1)[1]} -> {sha}")
    budget = failure_budget(len(hosts), progress.max_fail_percent)
    planned = plan_batches([(h, ["canary"] if h in canary else []) for h in hosts],
                           "canary" if canary else None, ramp_spec)  # fmt: skip
    say(
        f"{len(hosts)} host(s), failure budget {budget} host(s) "
        f"({shown_percent(progress.max_fail_percent)}%{budget_note}), "
        f"{len(planned)} batch(es) planned: "
        + " | ".join(
            f"{'canary ' if i == 0 and canary else ''}[{', '.join(b)}]"
            for i, b in enumerate(planned)
        )
    )
    save = (lambda: None) if dry else (lambda: write_progress(path, progress))
    save()

    def stopped(stop: str, answer: str, queue: list[str], unsettled: list[str] = ()) -> None:
        progress.stopped = stop
        save()
        untouched = [name for name in queue if name not in unsettled]
        again = f"; to do again: {', '.join(unsettled)}" if unsettled else ""
        say(f"rollout STOPPED: {stop}{again}; not touched: {', '.join(untouched) or 'none'}")
        say(f"progress: {path} ({answer})")

    started = time.monotonic()
    queue = progress.named("pending")
    with Interrupts() as interrupts:

        def pyinfra_started(pid: int) -> None:
            if progress.running is not None:
                progress.running.pyinfra_pid = pid
                progress.running.pyinfra_started = process_started(pid)
                save()

        runner = run or (
            lambda command, env: run_pyinfra(command, env, interrupts, say, pyinfra_started)
        )
        while True:
            stop = stop_reason(progress, budget)
            if stop:
                stopped(*stop, queue)
                return 1
            if not queue:
                break
            if interrupts.received:
                stopped(f"interrupted by {interrupts.first} between batches",
                        "--resume continues it", queue)  # fmt: skip
                return interrupts.exit_code
            in_canary = bool(canary) and queue[0] in canary
            if in_canary:
                batch = [name for name in queue if name in canary]
            else:
                batch = queue[: batch_size_at(ramp, progress.ramp_step, len(hosts))]
                progress.ramp_step += 1
            queue = [name for name in queue if name not in batch]
            progress.batches_run += 1
            index = progress.batches_run
            command = [
                "pyinfra", "--dry" if dry else "-y", inventory, deploy, *(pyinfra_args or [])
            ]  # fmt: skip
            for name in batch:
                command += ["--limit", limit_word[name]]  # that host alone, never a group
            total = index + batches_left(len(queue), ramp, progress.ramp_step, len(hosts))
            say(f"batch {index}/{total} [{', '.join(batch)}]{' (canary)' if in_canary else ''}: "
                f"$ {shlex.join(command)}")  # fmt: skip
            progress.running = RunningBatch(
                batch=index, hosts=batch, pid=os.getpid(), pid_started=process_started(os.getpid()),
                machine=socket.gethostname(), since=utc_iso(),
            )  # fmt: skip
            save()
            t0 = time.monotonic()
            signals_before = len(interrupts.received)
            code, notes = run_batch(command, progress.pins, runner)
            interrupted = interrupts.first if len(interrupts.received) > signals_before else None
            progress.log.append(BatchLog(hosts=batch, canary=in_canary, exit_code=code,
                                         notes=notes, seconds=round(time.monotonic() - t0, 1),
                                         interrupted=interrupted))  # fmt: skip
            settled, held = settle(batch, code, notes, interrupted=bool(interrupted))
            for name, outcome in settled.items():
                outcome.batch = index
                # a dry run changes nothing: its hosts stay to do (its failures still count)
                fresh = dry and outcome.state == "done"
                progress.state[name] = HostProgress() if fresh else outcome
            progress.running = None
            queue = held + queue  # held back: not restarted, first in the next batch
            failed_now = [n for n in batch if n in settled and settled[n].state == "failed"]
            for name in failed_now:
                entry = settled[name]
                say(f"FAILED host {name}: {entry.after or NOT_NOTED}\n  cause: "
                    + "\n  ".join((entry.cause or "").splitlines()))  # fmt: skip
            if held and interrupted:
                say(f"without an outcome (pyinfra stopped before their deploy ended: `specdeploy "
                    f"status` shows what each serves now; first in the next batch): "
                    f"{', '.join(held)}")  # fmt: skip
            elif held:
                say(f"held back in this batch (not restarted, still on their old config; first in "
                    f"the next batch): {', '.join(held)}")  # fmt: skip
            failed = progress.named("failed")
            say(f"batch {index}/{total} "
                f"{'interrupted' if interrupted else 'ended' if failed_now else 'done'} in "
                f"{time.monotonic() - t0:.0f}s (pyinfra exit {code}): "
                f"{len(progress.named('done'))} done, {len(failed)} failed of {len(hosts)}; "
                f"budget {budget}")  # fmt: skip
            if interrupted:
                stopped(f"interrupted by {interrupted} during batch {index}",
                        "--resume continues it: the batch's hosts without an outcome run again "
                        "first", queue, held)  # fmt: skip
                return interrupts.exit_code
            save()
    progress.finished = not dry
    save()
    failed = progress.named("failed")
    verdict = (
        f"rollout {'dry run ' if dry else ''}complete: {len(progress.named('done'))} done, "
        f"{len(failed)} failed (within the budget of {budget}) in "
        f"{time.monotonic() - started:.0f}s"
    )
    say(verdict + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def batch_size_at(ramp: list[int | str], step: int, hosts_in_rollout: int) -> int:
    """The ramp's `step`th batch (the last size repeats)."""
    return batch_size(ramp[min(step, len(ramp) - 1)], hosts_in_rollout)


def batches_left(hosts_left: int, ramp: list[int | str], step: int, hosts_in_rollout: int) -> int:
    """How many more batches the ramp takes for `hosts_left` (as planned: a held-back host adds
    one where it spills over)."""
    count = 0
    while hosts_left > 0:
        hosts_left -= batch_size_at(ramp, step + count, hosts_in_rollout)
        count += 1
    return count
