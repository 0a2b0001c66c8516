"""`specdeploy rollout` as a fleet operator expects (issue 37): a ramp of batches (numbers or
percentages), a failure budget across the rollout, held-back hosts first in the next batch, and a
progress file that `--resume` continues without touching finished hosts. The real controller
(flows/rollout.roll_out) runs; only pyinfra is replaced, by a batch that leaves each host's note
the way the deploy does (report/notes.py)."""

from __future__ import annotations

import json
import os
import stat
from io import StringIO

import pytest

from specdeploy.flows import rollout
from specdeploy.report import notes
from tests.unit.flows.rollout.fake_pyinfra import Batch, limited

HOSTS = [("c1", ["canary"])] + [(f"h{i}", []) for i in range(1, 11)]


@pytest.fixture
def fleet(monkeypatch, tmp_path):
    """An inventory of a canary and ten hosts; `outcome[host]` is what the deploy notes there
    (default done); `limits` each batch's --limit hosts, `pins_resolved` how often pins were."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(rollout, "inventory_hosts", lambda inventory: HOSTS)
    pins_resolved = []

    def pins(inventory, names):
        pins_resolved.append(names)
        return {"model|org/target": "a" * 40}

    monkeypatch.setattr(rollout, "fleet_pins", pins)
    batch = Batch(HOSTS)

    def run(command, env):
        assert json.loads(env["SPECDEPLOY_PINNED_REVISIONS"]) == {"model|org/target": "a" * 40}
        return batch(command, env)

    outcome, limits = batch.outcome, batch.limits
    return outcome, limits, pins_resolved, run, tmp_path


def roll(run, tmp_path, **kw):
    out = StringIO()
    code = rollout.roll_out("inv.py", "deploys/serve.py", out=out, run=run,
                            progress_path=tmp_path / "progress.json", **kw)  # fmt: skip
    return code, out.getvalue()


def progress(tmp_path):
    return json.loads((tmp_path / "progress.json").read_text())


def test_the_ramp_takes_numbers_and_percentages_of_the_rollouts_hosts():
    assert rollout.parse_ramp("1,5%,25%,100%") == [1, "5%", "25%", "100%"]
    # 11 hosts: the canary, then 1, 10% of 11 = 1, 30% = 3, then 3 again until done
    assert rollout.plan_batches(HOSTS, "canary", "1,10%,30%") == [
        ["c1"], ["h1"], ["h2"], ["h3", "h4", "h5"], ["h6", "h7", "h8"], ["h9", "h10"]
    ]  # fmt: skip
    assert rollout.plan_batches(HOSTS, None, "50%")[0] == ["c1", "h1", "h2", "h3", "h4"]
    assert rollout.plan_batches(HOSTS, "canary", 4)[1:] == [[f"h{i}" for i in range(1, 5)],
        [f"h{i}" for i in range(5, 9)], ["h9", "h10"]]  # fmt: skip


@pytest.mark.parametrize("spec", ["0", "0%", "101%", "-1", "five", "1,,2", "5%%"])
def test_a_bad_ramp_is_refused_before_any_host(spec, fleet):
    *_, run, tmp_path = fleet
    with pytest.raises(ValueError, match="is not a batch size"):
        roll(run, tmp_path, batches=spec)


def test_within_the_budget_a_failed_host_is_counted_and_the_rollout_goes_on(fleet):
    outcome, limits, _, run, tmp_path = fleet
    outcome["h2"] = {"cause": "h2: health check failed", "rolled_back": True, "after": "serving"}
    code, said = roll(run, tmp_path, batches="1,3", max_fail_percent=10)  # budget: 1 of 11
    assert code == 1  # a host failed: not a clean rollout, though it finished
    # h3 and h4 were held back behind h2 and go first in the next batch
    assert limits == [["c1"], ["h1"], ["h2", "h3", "h4"], ["h3", "h4", "h5"],
                      ["h6", "h7", "h8"], ["h9", "h10"]]  # fmt: skip
    state = progress(tmp_path)
    assert state["finished"] is True and state["stopped"] is None
    assert [h for h, s in state["state"].items() if s["state"] != "done"] == ["h2"]
    assert state["state"]["h2"]["cause"] == "h2: health check failed"
    assert "FAILED host h2: rolled back to its previous unit and env file; serving" in said
    assert "1 failed (within the budget of 1)" in said and "failed: h2" in said


def test_past_the_budget_the_rollout_stops_and_later_hosts_are_untouched(fleet):
    outcome, limits, _, run, tmp_path = fleet
    for name in ("h2", "h5"):
        outcome[name] = {"cause": f"{name}: health check failed", "rolled_back": True}
    code, said = roll(run, tmp_path, batches="1,3", max_fail_percent=10)
    assert code == 1
    assert limits[-1] == ["h3", "h4", "h5"]  # h3, h4 held back behind h2; nothing after h5
    assert "rollout STOPPED: 2 failed host(s) exceed the failure budget of 1" in said
    assert "not touched: h6, h7, h8, h9, h10" in said
    state = progress(tmp_path)
    assert state["stopped"] and not state["finished"]
    assert [h for h, s in state["state"].items() if s["state"] == "pending"] == [
        "h6", "h7", "h8", "h9", "h10"]  # fmt: skip


def test_without_a_budget_the_first_failure_stops_it_and_a_failed_canary_always_does(fleet):
    outcome, limits, _, run, tmp_path = fleet
    outcome["h1"] = {"cause": "h1: refused", "refused": True}
    assert roll(run, tmp_path)[0] == 1 and limits == [["c1"], ["h1"]]
    outcome.clear()
    outcome["c1"] = {"cause": "c1: health check failed", "rolled_back": True}
    limits.clear()
    code, said = roll(run, tmp_path, max_fail_percent=50)
    assert code == 1 and limits == [["c1"]] and "STOPPED: the canary failed" in said


def test_a_host_without_a_note_in_a_failed_batch_failed_before_any_step(fleet):
    outcome, limits, _, _, tmp_path = fleet

    def unreachable(command, env):
        return 1  # pyinfra could not connect: nothing of specdeploy ran

    code, said = roll(unreachable, tmp_path)
    assert code == 1
    assert "pyinfra failed it before any specdeploy step" in progress(tmp_path)["state"]["c1"][
        "cause"]  # fmt: skip


def test_resume_continues_a_killed_rollout_without_touching_finished_hosts(fleet):
    outcome, limits, pins_resolved, run, tmp_path = fleet
    outcome["h4"] = "kill"
    with pytest.raises(KeyboardInterrupt):
        roll(run, tmp_path, batches="1,3")
    assert limits[-1] == ["h2", "h3", "h4"]  # killed during this batch
    state = progress(tmp_path)
    assert [h for h, s in state["state"].items() if s["state"] == "done"] == ["c1", "h1"]
    outcome.clear()
    limits.clear()
    code, said = roll(run, tmp_path, resume=True)
    assert code == 0
    assert limits == [["h2", "h3", "h4"], ["h5", "h6", "h7"], ["h8", "h9", "h10"]]
    assert len(pins_resolved) == 1  # the resumed batches use the recorded pins
    assert progress(tmp_path)["finished"] is True
    assert "resuming" in said and "2 done, 0 failed, 9 to go" in said


def test_resume_refuses_another_fleet_and_retries_failed_hosts_only_when_asked(fleet, monkeypatch):
    outcome, limits, _, run, tmp_path = fleet
    outcome["h1"] = {"cause": "h1: health check failed", "rolled_back": True}
    roll(run, tmp_path)
    outcome.clear()
    code, said = roll(run, tmp_path, resume=True)  # the failure still counts: over budget 0
    assert code == 1 and "exceed the failure budget of 0" in said
    limits.clear()
    assert roll(run, tmp_path, resume=True, retry_failed=True)[0] == 0
    assert limits[0] == ["h1"] and ["c1"] not in limits
    monkeypatch.setattr(rollout, "inventory_hosts", lambda inventory: HOSTS[:5])
    outcome["h1"] = {"cause": "h1: again", "rolled_back": True}
    roll(run, tmp_path)
    with pytest.raises(ValueError, match="other hosts or another deploy"):
        monkeypatch.setattr(rollout, "inventory_hosts", lambda inventory: HOSTS)
        roll(run, tmp_path, resume=True)


def test_the_progress_file_is_private_and_a_dry_run_writes_none(fleet):
    *_, run, tmp_path = fleet
    roll(run, tmp_path, dry=True)
    assert not (tmp_path / "progress.json").exists()
    roll(run, tmp_path)
    assert stat.S_IMODE((tmp_path / "progress.json").stat().st_mode) == 0o600
    default = rollout.default_progress_path("inventories/prod.py", "deploys/serve.py")
    assert str(default).startswith(os.environ["XDG_STATE_HOME"]) and "prod-" in default.name


def test_a_note_is_private_never_follows_a_link_and_the_first_account_stays(tmp_path, monkeypatch):
    monkeypatch.setenv(notes.ROLLOUT_REPORT_ENV, str(tmp_path))
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere.json"
    elsewhere.write_text("{}")
    (tmp_path / "h1.json").symlink_to(elsewhere)
    notes.note({"host": "h1", "cause": "rolled back", "rolled_back": True})
    assert elsewhere.read_text() == "{}" and not (tmp_path / "h1.json").is_symlink()
    assert stat.S_IMODE((tmp_path / "h1.json").stat().st_mode) == 0o600
    notes.note({"host": "h1", "cause": "operation failed"}, first_only=True)
    assert notes.read_notes(tmp_path)["h1"]["cause"] == "rolled back"
    assert [p.name for p in tmp_path.iterdir()] == ["h1.json"]  # no partial left


def test_a_failed_operation_is_noted_unless_the_step_noted_first(tmp_path, monkeypatch):
    """pyinfra's failure hook (steps/lock.ReleaseOnFailure) notes a failed operation unless the
    step noted its own account first; the deploy's last operation notes done."""
    from types import SimpleNamespace

    from specdeploy.steps import lock

    monkeypatch.setenv(notes.ROLLOUT_REPORT_ENV, str(tmp_path))
    monkeypatch.setattr(lock, "_HELD", {})
    state = SimpleNamespace(
        get_op_data_for_host=lambda host, op: SimpleNamespace(global_arguments={}),
        get_op_meta=lambda op: SimpleNamespace(names={"Install vLLM 0.32.0"}),
    )
    lock.ReleaseOnFailure.operation_host_error(state, SimpleNamespace(name="h1"), "op1")
    notes.note({"host": "h2", "cause": "h2: ROLLED BACK", "rolled_back": True})
    lock.ReleaseOnFailure.operation_host_error(state, SimpleNamespace(name="h2"), "op1")
    found = notes.read_notes(tmp_path)
    assert (
        found["h1"]["cause"] == "h1: operation failed: Install vLLM 0.32.0 (see pyinfra's output)"
    )
    assert found["h2"]["cause"] == "h2: ROLLED BACK"
    assert rollout.settle(["h1", "h2", "h3"], 1, found | {"h3": {"host": "h3", "done": True}})[0][
        "h3"].state == "done"  # fmt: skip


# --- a failed host's line says what it serves now, however it failed --------------------------


def failing_batch(monkeypatch, failure):
    """A batch whose h2 fails as `failure` says: no note at all (pyinfra failed it), an operation
    that failed before or in its turn (the lock's failure hook notes it, as in a deploy), or a
    deploy other than serve (compare, tune: nothing tracked)."""
    import types

    from specdeploy.steps import lock

    monkeypatch.setattr(notes, "_SERVE_STAGE", {})

    def run(command, env):
        monkeypatch.setenv(notes.ROLLOUT_REPORT_ENV, env[notes.ROLLOUT_REPORT_ENV])
        for name in limited(command, HOSTS):
            if name != "h2":
                notes.note({"host": name, "done": True})
                continue
            if failure == "unreachable":
                continue  # no step ran: no note
            if failure in ("before the turn", "in the turn"):
                notes.serve_planned(name)
            if failure == "in the turn":
                notes.turn_began(name)
            state = types.SimpleNamespace()  # the hook reads nothing else it needs from it
            lock.ReleaseOnFailure.operation_host_error(
                state, types.SimpleNamespace(name=name), "op"
            )
        return 1

    return run


@pytest.mark.parametrize(
    "failure, says",
    [
        ("unreachable", "not rolled back (pyinfra failed it before any step noted a change): it "
         "should be still serving what it served before this run — `specdeploy status` confirms"),
        ("before the turn", "not rolled back (nothing it serves changed: the failure came before "
         "its turn to swap its unit and env file): still serving what it served before this run"),
        ("in the turn", "not rolled back: an operation failed in its turn, after its unit and env "
         "file may have been swapped; what it serves now is not known here — `specdeploy status` "
         "shows it"),
        ("another deploy", "not rolled back; what it serves now was not noted — `specdeploy "
         "status` shows it"),
    ],
)  # fmt: skip
def test_a_failed_hosts_line_says_what_it_serves_now(fleet, monkeypatch, failure, says):
    *_, tmp_path = fleet
    code, said = roll(failing_batch(monkeypatch, failure), tmp_path, canary_group=None,
                      limit=["h1", "h2"], batches="2")  # fmt: skip
    assert code == 1
    assert f"FAILED host h2: {says}\n  cause: h2: " in said
    assert progress(tmp_path)["state"]["h2"]["after"] == says


# --- a stop stays a stop until it is answered (issue 48, cases 3 and 4) -----------------------


def test_a_plain_resume_after_a_failed_canary_runs_the_canary_again_before_any_other_host(fleet):
    outcome, limits, _, run, tmp_path = fleet
    outcome["c1"] = {"cause": "c1: health check failed", "rolled_back": True}
    code, said = roll(run, tmp_path, batches="10%", max_fail_percent=10)  # budget: 1 of 11
    assert code == 1 and limits == [["c1"]]
    assert "rollout STOPPED: the canary failed" in said
    limits.clear()
    code, again = roll(run, tmp_path, resume=True)  # not fixed yet: the canary fails again
    assert code == 1 and limits == [["c1"]], again
    assert "rollout STOPPED: the canary failed" in again
    for text in (said, again):  # what the stop says is what a resume does
        assert "then --resume: the failed canary host(s) run again first" in text
    assert progress(tmp_path)["state"]["h1"]["state"] == "pending"
    outcome.clear()
    limits.clear()
    code, said = roll(run, tmp_path, resume=True)  # fixed: the canary passes, then the rest
    assert code == 0 and limits[0] == ["c1"] and sum(limits, []) == [name for name, _ in HOSTS]


def test_a_failed_canary_in_the_progress_file_stops_a_resume_before_any_other_host(fleet):
    """However the file came to say it (a stop cleared by an older controller's resume): no
    batch of other hosts runs while a canary host stands failed."""
    outcome, limits, _, run, tmp_path = fleet
    outcome["c1"] = {"cause": "c1: health check failed", "rolled_back": True}
    roll(run, tmp_path, batches="10%", max_fail_percent=10)
    state = progress(tmp_path)
    state["stopped"] = None
    (tmp_path / "progress.json").write_text(json.dumps(state))
    limits.clear()
    code, said = roll(run, tmp_path, resume=True)
    assert code == 1 and limits == [["c1"]]


def test_every_resume_past_a_spent_budget_stops_before_any_batch(fleet):
    outcome, limits, _, run, tmp_path = fleet
    for name in ("h2", "h5"):
        outcome[name] = {"cause": f"{name}: health check failed", "rolled_back": True}
    roll(run, tmp_path, batches="1,3", max_fail_percent=10)  # budget 1: stops at h5
    untouched = ["h6", "h7", "h8", "h9", "h10"]
    for _ in range(3):  # repeated resumes do not walk the fleet
        limits.clear()
        code, said = roll(run, tmp_path, resume=True)
        assert code == 1 and limits == [], said
        assert "rollout STOPPED: 2 failed host(s) exceed the failure budget of 1" in said
        assert "--resume --retry-failed" in said and "--resume --max-fail-percent" in said
        state = progress(tmp_path)
        assert [h for h, s in state["state"].items() if s["state"] == "pending"] == untouched
        assert state["stopped"] and not state["finished"]
    code, said = roll(run, tmp_path, resume=True, max_fail_percent=20)  # answered: budget 2
    assert limits == [["h6", "h7", "h8"], ["h9", "h10"]]
    assert code == 1 and progress(tmp_path)["finished"] is True
    assert "failure budget 2 host(s) (20%, was 10%)" in said


# --- sizes in exact arithmetic (issue 48, case 10) ---------------------------------------------


def one_decimal_percentages():
    return [f"{tenths // 10}.{tenths % 10}" for tenths in range(1, 1000)]


def test_ramp_and_budget_sizes_are_exact_where_floating_point_is_not():
    floating = [
        (n, p)
        for n in range(1, 1001)
        for p in one_decimal_percentages()
        if int(n * float(p) / 100) != n * int(p.replace(".", "")) // 1000
    ]
    assert len(floating) == 42 and (375, "18.4") in floating
    for n, p in floating:
        exact = n * int(p.replace(".", "")) // 1000
        assert rollout.batch_size(f"{p}%", n) == max(1, exact), (n, p)
        assert rollout.failure_budget(n, p) == exact, (n, p)


def test_the_rollout_says_the_exact_budget(fleet, monkeypatch):
    *_, run, tmp_path = fleet
    monkeypatch.setattr(rollout, "inventory_hosts", lambda inventory: [(f"h{i}", []) for i in
                                                                       range(375)])  # fmt: skip
    code, said = roll(run, tmp_path, canary_group=None, batches="18.4%", max_fail_percent=18.4)
    assert code == 0 and "375 host(s), failure budget 69 host(s) (18.4%)" in said
    assert "batch 1/6 [h0, " in said and "h68]" in said  # 69 hosts a batch, not 68


# --- a batch runs on its own hosts, whatever they are named (issue 48, case 13) ---------------

ODD_NAMES = [("c1", ["canary"]), ("a1", ["gpu"]), ("a2", ["gpu"]), ("gpu", ["gpu"]),
             ("n[1]", []), ("n1", []), ("b*", []), ("b2", []), ("q?", []), ("qq", [])]  # fmt: skip


def test_a_batch_runs_on_its_hosts_only_though_one_is_named_like_a_group_or_a_pattern(
    fleet, monkeypatch
):
    *_, tmp_path = fleet
    monkeypatch.setattr(rollout, "inventory_hosts", lambda inventory: ODD_NAMES)
    batch = Batch(ODD_NAMES)
    code, said = roll(batch, tmp_path, batches="1")
    assert code == 0
    assert batch.limits == [[name] for name, _ in ODD_NAMES]  # none widened, none narrowed
    code, said = roll(batch, tmp_path, batches="3")
    assert batch.limits[len(ODD_NAMES) :] == [["c1"], ["a1", "a2", "gpu"], ["n[1]", "n1", "b*"],
                                              ["b2", "q?", "qq"]]  # fmt: skip


def test_a_hosts_limit_word_selects_it_alone_in_pyinfra_or_is_refused(fleet, monkeypatch):
    from specdeploy.config.inventory import exact_host_pattern

    names = [name for name, _ in ODD_NAMES] + ["!x", "x!", "a]b", "all", "-", "^"]
    hosts = [(name, groups) for name, groups in ODD_NAMES] + [(n, []) for n in names[10:]]
    for name in names:
        command = ["pyinfra", "--limit", exact_host_pattern(name)]
        assert limited(command, hosts) == [name], name  # pyinfra's own matcher
    with pytest.raises(ValueError, match="no --limit word"):
        exact_host_pattern("!!")
    *_, run, tmp_path = fleet
    clash = [("c1", ["canary"]), ("h1", ["[h]1"]), ("h2", ["[h]1"])]  # a function inventory's
    monkeypatch.setattr(rollout, "inventory_hosts", lambda inventory: clash)
    with pytest.raises(ValueError, match=r"host 'h1': its --limit word '\[h\]1' would select the "
                       r"group '\[h\]1' in pyinfra"):  # fmt: skip
        roll(run, tmp_path)
    assert not (tmp_path / "progress.json").exists()  # refused before any host


def test_a_resume_beside_a_running_controller_is_refused(fleet):
    import subprocess
    import sys

    outcome, limits, _, run, tmp_path = fleet
    outcome["h2"] = "kill"
    with pytest.raises(KeyboardInterrupt):
        roll(run, tmp_path)
    state = progress(tmp_path)
    assert state["running"]["hosts"] == ["h2"]  # what the file says: a batch was running
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state["running"]["pid"] = other.pid
        state["running"]["pid_started"] = rollout.process_started(other.pid)
        (tmp_path / "progress.json").write_text(json.dumps(state))
        limits.clear()
        with pytest.raises(ValueError, match=f"still runs \\(pid {other.pid} on"):
            roll(run, tmp_path, resume=True)
        assert limits == []
        state["running"]["pid_started"] = "1"  # that pid is another process now
        (tmp_path / "progress.json").write_text(json.dumps(state))
        outcome.clear()
        code, said = roll(run, tmp_path, resume=True)
        assert code == 0 and limits[0] == ["h2"] and "died during batch 3 [h2]" in said
    finally:
        other.kill()
        other.wait()


def test_a_progress_file_of_schema_1_is_resumed(fleet):
    outcome, limits, _, run, tmp_path = fleet
    for name in ("h1", "h2"):
        outcome[name] = {"cause": f"{name}: health check failed", "rolled_back": True}
    roll(run, tmp_path, max_fail_percent=10)
    state = progress(tmp_path)
    state.pop("running")
    for entry in state["log"]:
        entry.pop("interrupted")
    state |= {"schema_version": 1, "max_fail_percent": 10.0}
    (tmp_path / "progress.json").write_text(json.dumps(state))
    outcome.clear()
    code, said = roll(run, tmp_path, resume=True, retry_failed=True)
    assert code == 0 and "failure budget 1 host(s) (10%)" in said and "complete" in said


class SignalOnLine(StringIO):
    """The controller's output; the process gets `number` once a line says `text`."""

    def __init__(self, text: str, number: int):
        super().__init__()
        self.text, self.number, self.sent = text, number, False

    def write(self, s: str) -> int:
        written = super().write(s)
        if self.text in s and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.number)
        return written


def test_a_signal_between_batches_stops_the_rollout_before_the_next(fleet):
    import signal

    _, limits, _, run, tmp_path = fleet
    out = SignalOnLine("batch 2/", signal.SIGTERM)  # "batch 2/N done ...": after its hosts
    code = rollout.roll_out("inv.py", "deploys/serve.py", out=out, run=run, batches="2",
                            progress_path=tmp_path / "progress.json")  # fmt: skip
    said = out.getvalue()
    assert code == 143 and limits == [["c1"], ["h1", "h2"]], said
    state = progress(tmp_path)
    assert state["stopped"] == "interrupted by SIGTERM between batches"
    assert [h for h, s in state["state"].items() if s["state"] == "done"] == ["c1", "h1", "h2"]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handler is the caller's again
    limits.clear()
    assert roll(run, tmp_path, resume=True)[0] == 0 and limits[0] == ["h3", "h4"]
