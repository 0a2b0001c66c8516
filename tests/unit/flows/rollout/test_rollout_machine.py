"""The rollout controller as a state machine (issue 48), checked by hypothesis: the real controller
(flows/rollout.roll_out) runs rollouts and resumes over a random fleet (a canary group, a ramp of
numbers and percentages, a failure budget to the hundredth of a percent, hosts named like a group
or a pattern), with the fake pyinfra batch of the controller's tests: every host's outcome drawn
(done, failed and rolled back, failed before any step noted it, Ctrl-C or SIGTERM while its turn
runs, the controller killed outright), a signal between two batches, resumes with and without
--retry-failed and with a new budget. What must hold at every batch and after every run:

* an unanswered failed canary, or failed hosts past the budget, let no batch start: every batch
  starts from a progress file with no failed canary host and no more failed hosts than the budget;
* a host once recorded done is never in a later batch;
* each batch is what pyinfra runs (its --limit resolved as pyinfra resolves it) and what the
  progress file says is running, of the size exact arithmetic gives (the canary group whole);
* the progress file always parses and says what happened: each host's outcome as its batch
  left it, the stop and why, the interruption and by what, the batch a killed controller ran."""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
from io import StringIO
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from specdeploy.flows import rollout
from specdeploy.report import notes
from tests.unit.flows.rollout.fake_pyinfra import limited


def cents(value: int) -> str:
    """A percentage to the hundredth, as an operator writes it: 1834 -> '18.34'."""
    return f"{value // 100}.{value % 100:02d}"


def exact_share(hosts: int, percent: str) -> int:
    """floor(hosts * percent / 100) in integers: the oracle for sizes and budgets."""
    whole, _, fraction = percent.partition(".")
    scale = 10 ** len(fraction)
    return hosts * int(whole + fraction) // (100 * scale)


# Host names a batch's --limit must not widen or narrow: a group's name, a bracket, a glob.
NAMES = ["h0", "web", "h[2]", "h2", "db*", "h5", "q?", "qq", "h8", "h9"]
# Where a float product falls short of a whole number (int(375 * 18.4 / 100) == 68, exact 69).
FLEETS = [375, 750, 875, 1000]
TRAPS = ["18.4", "32.8", "9.2", "64.6", "32.3", "64.1"]
PERCENT = st.one_of(st.sampled_from(TRAPS), st.integers(1, 1000).map(
    lambda tenths: f"{tenths // 10}.{tenths % 10}"))  # fmt: skip
BUDGET = st.one_of(st.just("0"), st.sampled_from(TRAPS), st.integers(0, 9999).map(cents))
# A host's outcome in one run (done when not drawn): failures often, signals and kills less.
OUTCOMES = ["failed", "failed", "failed", "unnoted", "ok", "SIGINT", "SIGTERM", "kill"]
# The progress file is fsynced after every batch: in memory where there is such a place.
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


class ControllerKilled(KeyboardInterrupt):
    """The controller killed outright mid-batch: nothing after the kill runs."""


class SignalBetweenBatches(StringIO):
    """The controller's output: `number` is sent to this process once the `after`th batch summary
    of this run is printed (its hosts settled, the next batch not begun)."""

    SUMMARY = re.compile(r"batch \d+/\d+ (done|ended|interrupted) in")

    def __init__(self, after: int | None, number: int | None, sent: list):
        super().__init__()
        self.after, self.number, self.seen, self.sent = after, number, 0, sent

    def write(self, s: str) -> int:
        written = super().write(s)
        if self.after is not None and self.SUMMARY.search(s):
            self.seen += 1
            if self.seen == self.after:
                self.sent.append(self.number)
                os.kill(os.getpid(), self.number)
        return written


class Rollouts(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="rollout-machine-", dir=SCRATCH))
        self.path = self.tmp / "progress.json"
        self.patch = pytest.MonkeyPatch()
        self.patch.setattr(rollout, "inventory_hosts", lambda inventory: self.hosts)
        self.patch.setattr(rollout, "fleet_pins", lambda inventory, names: {})
        self.ever_done: set[str] = set()
        self.outcome: dict[str, str] = {}
        self.batches_this_run = 0

    def teardown(self):
        self.patch.undo()
        shutil.rmtree(self.tmp, ignore_errors=True)

    @initialize(
        n=st.integers(1, 10),
        canary=st.sets(st.integers(0, 3), max_size=2),
        ramp=st.lists(st.one_of(st.integers(1, 3), PERCENT.map(lambda p: p + "%")), min_size=1,
                      max_size=3),
        budget=BUDGET,
    )  # fmt: skip
    def fleet(self, n, canary, ramp, budget):
        names = NAMES[:n]
        in_canary = {names[i] for i in canary if i < n}
        self.hosts = [
            (name, (["canary"] if name in in_canary else []) + (["web"] if i % 2 else []))
            for i, name in enumerate(names)
        ]
        self.ramp = ",".join(str(step) for step in ramp)
        self.budget_percent = budget

    # --- the fake pyinfra: one batch, checked against the progress file it starts from -------

    def batch(self, command: list[str], env: dict) -> int:
        batch = limited(command, self.hosts)  # what pyinfra would run
        assert not self.signalled, "a batch started after a signal"
        progress = rollout.read_progress(self.path)  # parses, as written before the batch
        assert progress is not None and progress.running is not None
        assert progress.running.hosts == batch, (progress.running.hosts, batch)
        failed = progress.named("failed")
        assert not [name for name in failed if name in progress.canary], "past a failed canary"
        budget = exact_share(len(progress.hosts), progress.max_fail_percent)
        assert len(failed) <= budget, f"a batch past the budget: {failed} > {budget}"
        assert not set(batch) & self.ever_done, f"a finished host limited again: {batch}"
        pending = progress.named("pending")
        if batch[0] in progress.canary:
            assert batch == [name for name in pending if name in progress.canary]
        else:
            assert not [name for name in pending if name in progress.canary]
            steps = rollout.parse_ramp(progress.batches)
            step = steps[min(progress.ramp_step - 1, len(steps) - 1)]
            size = step if isinstance(step, int) else max(1, exact_share(len(progress.hosts),
                                                                         step[:-1]))  # fmt: skip
            assert batch == pending[:size], (batch, pending, size)
        self.batches_this_run += 1
        self.ran.append(batch)
        self.word = {}  # this batch's hosts as it leaves them: a host can run in two batches
        code = self.pyinfra(batch, env)
        self.settled.append(self.word)  # a killed batch never gets here: it recorded nothing
        return code

    def pyinfra(self, batch: list[str], env: dict) -> int:
        """The batch's notes as the serve deploy leaves them; a host after a failed one is held
        back; a signal stops pyinfra after the turn in progress (no note: the deploy's last
        operation did not run), and it exits 0 as pyinfra does."""
        before = os.environ.get(notes.ROLLOUT_REPORT_ENV)
        os.environ[notes.ROLLOUT_REPORT_ENV] = env[notes.ROLLOUT_REPORT_ENV]
        try:
            failed, code, stopped, unnoted = None, 0, False, []
            for name in batch:
                what = self.outcome.get(name, "ok")
                if stopped:
                    self.word[name] = "pending"
                    continue
                if what == "kill":
                    raise ControllerKilled
                if what in ("SIGINT", "SIGTERM"):
                    self.signalled.append(what)
                    os.kill(os.getpid(), getattr(signal, what))
                    stopped = True
                    self.word[name] = "pending"
                    continue
                if failed and what != "unnoted":
                    notes.note({"host": name, "held_back": True, "cause": f"{failed} failed"})
                    self.word[name] = "pending"
                elif what == "ok":
                    notes.note({"host": name, "done": True})
                    self.word[name] = "done"
                elif what == "failed":
                    notes.note({"host": name, "cause": f"{name}: health", "rolled_back": True})
                    failed, code = name, 1
                    self.word[name] = "failed"
                else:  # no step noted anything: unreachable
                    code = 1
                    self.word[name] = "failed"
                    unnoted.append(name)
            if stopped:  # an interrupted batch: a host without a note is not known to have failed
                self.word.update({name: "pending" for name in unnoted})
            return 0 if stopped else code
        finally:
            if before is None:
                os.environ.pop(notes.ROLLOUT_REPORT_ENV, None)
            else:
                os.environ[notes.ROLLOUT_REPORT_ENV] = before

    # --- runs ---------------------------------------------------------------------------------

    outcomes = st.dictionaries(st.sampled_from(NAMES), st.sampled_from(OUTCOMES), max_size=3)
    between = st.one_of(*[st.none()] * 3, st.tuples(st.integers(1, 3), st.sampled_from(
        [signal.SIGINT, signal.SIGTERM])))  # fmt: skip

    def run(self, outcome, between, **kw) -> None:
        before = rollout.read_progress(self.path) if self.path.exists() else None
        self.outcome, self.batches_this_run, self.ran, self.settled = outcome, 0, [], []
        self.signalled: list = []
        out = SignalBetweenBatches(*(between or (None, None)), self.signalled)
        killed = False
        try:
            code = rollout.roll_out("inv.py", "deploys/serve.py", canary_group="canary"
                                    if any("canary" in g for _, g in self.hosts) else None,
                                    batches=self.ramp, progress_path=self.path, out=out,
                                    run=self.batch, **kw)  # fmt: skip
        except ControllerKilled:
            killed, code = True, None
        except ValueError:  # refused before any host
            assert self.batches_this_run == 0
            raise
        self.started = True
        said = out.getvalue()
        after = rollout.Progress.model_validate_json(self.path.read_text())  # always parses
        self.ever_done |= set(after.named("done"))
        # what each host's last batch of this run left it as; a killed batch recorded nothing
        last: dict[str, str] = {}
        for words in self.settled:
            last.update(words)
        for name, word in last.items():
            assert after.state[name].state == word, (name, word, after.state[name], said)
        if killed:
            event("run ended: controller killed")
            assert after.running is not None and after.running.hosts == self.ran[-1]
            assert after.stopped is None and not after.finished
            return
        assert after.running is None
        failed = after.named("failed")
        budget = exact_share(len(after.hosts), after.max_fail_percent)
        assert f"failure budget {budget} host(s)" in said
        canary_failed = [name for name in failed if name in after.canary]
        if code == 0:
            assert after.finished and not failed and after.stopped is None
        elif code == 1 and after.stopped:
            assert canary_failed or len(failed) > budget, after.stopped
            assert not after.finished and "rollout STOPPED" in said
            answer = "--resume: the failed canary" if canary_failed else "--resume --retry-failed"
            assert answer in said
        elif code == 1:
            assert after.finished and failed and len(failed) <= budget and not canary_failed
        else:
            name = {130: "SIGINT", 143: "SIGTERM"}[code]
            assert after.stopped.startswith(f"interrupted by {name}") and not after.finished
            if "during batch" in after.stopped:
                assert after.log[-1].interrupted == name
        event(f"run ended: {code}" + (f", {after.stopped.split(' (')[0].split(':')[0]}"
                                       if after.stopped else ""))  # fmt: skip
        if kw.get("resume") and before is not None and before.stopped:
            event(f"resumed after: {before.stopped.split(' (')[0]}, retry {kw['retry_failed']}")
        if kw.get("resume") and before is not None:
            percent = kw.get("max_fail_percent") or before.max_fail_percent
            spent = 0 if kw["retry_failed"] else len(
                [n for n in before.named("failed") if n not in before.canary])  # fmt: skip
            if spent > exact_share(len(before.hosts), percent):
                assert self.batches_this_run == 0 and code == 1, said  # stopped before any batch
            canary = [n for n in before.named("failed") if n in before.canary]
            if canary and spent <= exact_share(len(before.hosts), percent):
                assert self.ran and set(canary) <= set(self.ran[0]), said  # run again, first

    @rule(outcome=outcomes, between=between)
    def start(self, outcome, between):
        self.ever_done = set()  # a new rollout: every host to do again
        self.run(outcome, between, max_fail_percent=self.budget_percent)

    def resumable(self) -> bool:
        progress = rollout.read_progress(self.path)
        return progress is not None and not progress.finished

    @rule(outcome=outcomes, between=between, retry=st.booleans(),
          budget=st.one_of(st.none(), BUDGET))  # fmt: skip
    def resume(self, outcome, between, retry, budget):
        if not self.resumable():  # nothing to resume: refused, no batch
            with pytest.raises(ValueError, match="--resume: no unfinished rollout"):
                self.run(outcome, between, resume=True)
            return
        self.run(outcome, between, resume=True, retry_failed=retry, max_fail_percent=budget)

    @invariant()
    def the_progress_file_parses(self):
        if self.path.exists():
            rollout.Progress.model_validate_json(self.path.read_text())

    @invariant()
    def no_handler_is_left_behind(self):
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            assert signal.getsignal(number) is not rollout.Interrupts.handle


Rollouts.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_the_rollout_controller = Rollouts.TestCase


# --- sizes at fleet scale -----------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    n=st.one_of(st.sampled_from(FLEETS), st.integers(1, 1000)),
    ramp=st.lists(PERCENT.filter(lambda p: float(p) >= 9), min_size=1, max_size=3),
    budget=BUDGET,
)
def test_batch_and_budget_sizes_at_fleet_scale_are_exact(n, ramp, budget):
    """The real controller over a fleet of up to 1,000 hosts, every host done: each batch is the
    size exact arithmetic gives for its ramp step, and so is the budget it states."""
    hosts = [(f"h{i}", []) for i in range(n)]
    steps = [step + "%" for step in ramp]
    batches: list[list[str]] = []
    with tempfile.TemporaryDirectory(dir=SCRATCH) as scratch, pytest.MonkeyPatch.context() as mp:
        path = Path(scratch) / "progress.json"
        mp.setattr(rollout, "inventory_hosts", lambda inventory: hosts)
        mp.setattr(rollout, "fleet_pins", lambda inventory, names: {})

        def batch(command, env):
            batches.append(rollout.read_progress(path).running.hosts)
            return 0

        out = StringIO()
        code = rollout.roll_out("inv.py", "deploys/serve.py", canary_group=None,
                                batches=",".join(steps), max_fail_percent=budget,
                                progress_path=path, out=out, run=batch)  # fmt: skip
    assert code == 0
    assert f"{n} host(s), failure budget {exact_share(n, budget)} host(s)" in out.getvalue()
    left = n
    for i, hosts_of_batch in enumerate(batches):
        size = max(1, exact_share(n, steps[min(i, len(steps) - 1)][:-1]))
        assert len(hosts_of_batch) == min(size, left), (i, steps, n)
        left -= len(hosts_of_batch)
    assert left == 0
