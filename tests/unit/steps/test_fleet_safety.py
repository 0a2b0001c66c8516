"""Fleet safety, the pure parts (issue 21): the rolling restart's gate (a failed host holds back
the hosts after it), its pyinfra parallelism arguments, the deploy lock's host commands (run for
real in a temporary directory), the token file's no-change path (facts in, no commands out), and
the workload-change detection that makes a new request set measured."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from types import SimpleNamespace

import pytest
from pyinfra.api.exceptions import PyinfraError

from specdeploy.checks.host_data import check_host as check_data
from specdeploy.config.record import RecordedWorkload
from specdeploy.config.schema import LOCK_DIR, config_from_data
from specdeploy.host import bench
from specdeploy.render.units import RenderedUnit
from specdeploy.steps import dataset, lock, rollback, secrets


class FakeChange:
    """A steps.unit.UnitChange stand-in: records whether the host was swapped in / restarted."""

    def __init__(self, pending=True):
        self._pending, self.applied = pending, False

    def pending(self):
        return self._pending

    def changed(self):
        return self.applied

    def apply(self):
        self.applied = True
        return True


@pytest.fixture
def fleet(monkeypatch, valid_data):
    """verify_or_rollback on fake hosts: every host command is recorded, none is run."""
    calls: list[tuple[str, str]] = []
    current = SimpleNamespace(name="h1", print_prefix="[h1] ")
    monkeypatch.setattr(rollback, "host", current)
    monkeypatch.setattr(rollback, "GATE", rollback.RolloutGate())
    monkeypatch.setattr(rollback.lock, "release_now", lambda cfg: calls.append(("release", "")))
    monkeypatch.setattr(rollback.lock, "renew_held", lambda seconds: None)
    fake_server = SimpleNamespace(
        is_active=lambda unit: "active",
        restart=lambda unit: calls.append(("restart", current.name)),
        start_if_inactive=lambda unit: False,
        restore_previous=lambda cfg, unit: calls.append(("restore", current.name)) or "kept",
        stop=lambda units: calls.append(("stop", current.name)),
        wait_healthy=lambda cfg, unit, speculative: {"seconds_to_healthy": 1.0},
        enable_only=lambda cfg, role: None,
        unverified_installed=lambda cfg, unit, verified_sha256: False,
        stop_others=lambda cfg, keep: None,
    )
    monkeypatch.setattr(rollback, "server", fake_server)
    monkeypatch.setattr(rollback.turn, "server", fake_server)  # the turn's one restore path
    monkeypatch.setattr(rollback, "unit_exec_argv", lambda text: ["/venv/bin/python"])
    cfg = config_from_data(valid_data)
    unit = RenderedUnit(
        name="specdeploy-vllm.service",
        text="",
        argv=[],
        role="speculative",
        path="/etc/systemd/system/specdeploy-vllm.service",
    )

    def run_host(name, verify):
        current.name, current.print_prefix = name, f"[{name}] "
        change = FakeChange()
        try:
            return change, rollback.verify_or_rollback(verify, cfg, unit, change=change)
        except Exception as error:
            return change, error

    return SimpleNamespace(calls=calls, run_host=run_host)


def broken(cfg, rendered):
    raise RuntimeError("not healthy after 30s (it crashed and systemd restarted it)")


def fine(cfg, rendered):
    return "verified"


def test_a_failed_host_holds_back_every_host_after_it(fleet):
    first, error = fleet.run_host("h1", broken)
    assert first.applied and isinstance(error, rollback.RolledBack)
    assert ("restart", "h1") in fleet.calls and ("restore", "h1") in fleet.calls
    second, held = fleet.run_host("h2", fine)
    assert isinstance(held, rollback.HeldBack)
    assert not second.applied  # not swapped in, not restarted, never verified
    assert str(held).startswith("h2: not restarted: h1 failed first")
    assert "keeps serving its current config" in str(held)
    assert ("restart", "h2") not in fleet.calls and ("release", "") in fleet.calls
    third, held = fleet.run_host("h3", fine)
    assert "h1 failed first" in str(held)  # the first failure is named, not the last held back


def test_a_lost_lease_stops_the_host_before_its_swap(fleet, monkeypatch):
    def lost(seconds):
        raise lock.LockLost("h1: the deploy lock ... is no longer this deploy's")

    monkeypatch.setattr(rollback.lock, "renew_held", lost)
    change, error = fleet.run_host("h1", fine)
    assert isinstance(error, lock.LockLost) and not change.applied
    assert fleet.calls == [] and rollback.GATE.failed_first() is None  # nothing touched


def test_hosts_before_a_failure_are_restarted_and_verified(fleet):
    change, result = fleet.run_host("h1", fine)
    assert result == "verified" and change.applied and ("restart", "h1") in fleet.calls
    change, result = fleet.run_host("h2", fine)
    assert result == "verified" and rollback.GATE.failed_first() is None


def test_gate_names_verify_only_hosts_not_verified():
    gate = rollback.RolloutGate()
    gate.note_failure("a")
    gate.note_failure("b")
    gate.note_failure("a")
    assert gate.failed == ["a", "b"] and gate.failed_first() == "a"
    text = gate.held_back_message("c", "u.service", "active", restart=False)
    assert text.startswith("c: not verified: a failed first")


def run_state(hosts: int):
    return SimpleNamespace(activated_hosts=set(range(hosts)))


def test_out_of_service_width_is_serial_by_default_and_one_value_per_run(monkeypatch, valid_data):
    """The rolling restart and every compare/tune measurement take at most max_unavailable hosts
    off their deployed unit at once."""
    monkeypatch.setattr(rollback, "_PARALLEL", {})
    state = run_state(4)
    monkeypatch.setattr(rollback, "host", SimpleNamespace(name="h1", state=state))
    assert rollback.out_of_service_width(config_from_data(valid_data)) == {"_serial": True}
    monkeypatch.setattr(rollback, "host", SimpleNamespace(name="h2", state=state))
    wide = config_from_data({**valid_data, "max_unavailable": 3})
    with pytest.raises(PyinfraError, match="h2: max_unavailable is 3, but h1 .* has 1"):
        rollback.out_of_service_width(wide)
    monkeypatch.setattr(rollback, "host", SimpleNamespace(name="h3", state=run_state(4)))
    assert rollback.out_of_service_width(wide) == {"_parallel": 3}
    assert rollback.width_text(wide) == "3 hosts at a time"


@pytest.mark.parametrize(
    ("setting", "hosts", "at_once"),
    [("25%", 8, 2), ("25%", 200, 50), ("10%", 3, 1), ("100%", 5, 5), ("50%", 1, 1), (2, 200, 2)],
)
def test_max_unavailable_as_a_share_of_the_run(monkeypatch, valid_data, setting, hosts, at_once):
    monkeypatch.setattr(rollback, "_PARALLEL", {})
    monkeypatch.setattr(rollback, "host", SimpleNamespace(name="h1", state=run_state(hosts)))
    cfg = config_from_data({**valid_data, "max_unavailable": setting})
    width = rollback.out_of_service_width(cfg)
    assert width == ({"_serial": True} if at_once == 1 else {"_parallel": at_once})


@pytest.mark.parametrize("bad", ["0%", "150%", "25 %", "a%", 0, -1])
def test_max_unavailable_refuses_what_is_no_budget(valid_data, bad):
    problems = check_data("h1", {**valid_data, "max_unavailable": bad})
    assert any(p.field.startswith("max_unavailable") for p in problems), problems


def test_the_old_key_is_refused_with_the_new_name(valid_data):
    problems = check_data("h1", {**valid_data, "rollout_max_parallel": 3})
    (problem,) = [p for p in problems if p.field == "rollout_max_parallel"]
    assert "max_unavailable" in problem.todo


# --- the deploy lock's commands ---------------------------------------------------------------


def sh(command: str) -> str:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout.strip()


def test_lock_lives_in_a_root_only_directory(valid_data):
    cfg = config_from_data(valid_data)
    assert LOCK_DIR == "/run/specdeploy/locks"
    assert cfg.lock_path == "/run/specdeploy/locks/specdeploy-vllm.deploy.lock"
    command = lock.acquire_command(cfg.lock_path, "holder=a@b:1")
    assert "install -d -m 700 -o root -g root /run/specdeploy/locks" in command
    assert "set -C" in command and "[ -L /run/specdeploy/locks/specdeploy-vllm" in command


@pytest.mark.skipif(os.geteuid() != 0, reason="install -o root needs root")
def test_lock_commands_take_refuse_and_release_for_real(tmp_path):
    parent = tmp_path / "run"
    path = str(parent / "locks" / "svc.deploy.lock")
    take = lock.acquire_command(path, "holder=me@ctl:1 since=now", parent=str(parent))
    assert sh(take) == lock.ACQUIRED
    assert oct((parent / "locks").stat().st_mode & 0o777) == "0o700"
    assert lock.parse_holder(sh(take))["holder"] == "me@ctl:1"  # held: the holder's line
    other = lock.acquire_command(path, "holder=you@ctl:2", parent=str(parent))
    assert lock.parse_holder(sh(other))["who"] == "me@ctl"
    sh(lock.release_command(path, "you@ctl:2"))  # not the holder: stays
    assert os.path.exists(path)
    sh(lock.release_command(path, "me@ctl:1"))
    assert not os.path.exists(path)
    # a planted symlink is refused and never followed (nor written through)
    victim = tmp_path / "victim"
    victim.write_text("holder=mallory@x:1\n")
    os.symlink(victim, path)
    out = sh(take)
    assert out.startswith(lock.REFUSED) and "symbolic link" in out and "mallory" not in out
    sh(lock.release_command(path, "mallory@x:1"))
    assert os.path.islink(path) and victim.read_text() == "holder=mallory@x:1\n"
    # the planning-time read does not follow it either
    assert sh(lock.peek_command(path, parent=str(parent))).startswith(lock.REFUSED)
    # a symlinked lock directory is refused too
    os.unlink(path)
    os.rmdir(parent / "locks")
    os.symlink(tmp_path, parent / "locks")
    assert sh(take).startswith(lock.REFUSED)


def test_release_command_ignores_a_lock_of_another_holder(tmp_path):
    path = tmp_path / "x.lock"
    path.write_text("holder=me@ctl:12 since=now\n")
    sh(lock.release_command(str(path), "me@ctl:1"))  # a prefix of the holder is not the holder
    assert path.exists()


def test_failure_hook_releases_only_locks_this_process_holds(monkeypatch):
    released = []
    monkeypatch.setattr(lock, "release_path", lambda p: released.append(p))
    monkeypatch.setattr(lock, "_HELD", {"h1": {"/run/specdeploy/locks/a.deploy.lock"}})
    data = SimpleNamespace(global_arguments={"_ignore_errors": False})
    state = SimpleNamespace(get_op_data_for_host=lambda host, op: data)
    hook = lock.ReleaseOnFailure()
    hook.operation_host_error(state, SimpleNamespace(name="h2", print_prefix=""), "op")
    assert released == []
    hook.operation_host_error(state, SimpleNamespace(name="h1", print_prefix=""), "op")
    assert released == ["/run/specdeploy/locks/a.deploy.lock"]
    data.global_arguments["_ignore_errors"] = True  # the deploy goes on: keep the lock
    released.clear()
    hook.operation_host_error(state, SimpleNamespace(name="h1", print_prefix=""), "op")
    assert released == []


def test_failure_hook_is_installed_once_per_state():
    state = SimpleNamespace(callback_handlers=[])
    state.add_callback_handler = state.callback_handlers.append
    lock.install_failure_hook(state)
    lock.install_failure_hook(state)
    assert len(state.callback_handlers) == 1


# --- the token file: a no-op re-run is a no-op -------------------------------------------------


class FactsHost:
    """pyinfra-style operation fixture: facts in, commands out (the operation's generator)."""

    def __init__(self, facts: dict):
        self.facts, self.noops = facts, []

    def get_fact(self, fact, **kwargs):
        return self.facts[fact.__name__]

    def noop(self, description):
        self.noops.append(description)


def commands(monkeypatch, facts, **kwargs):
    fake = FactsHost(facts)
    monkeypatch.setattr(secrets, "host", fake)
    return list(secrets.secret_file._inner(**kwargs)), fake.noops


def test_token_file_unchanged_yields_no_command(monkeypatch):
    token = "hf_abcdef"
    on_host = hashlib.sha1((token + "\n").encode()).hexdigest()  # what stdin left in the file
    facts = {"Sha1File": on_host, "File": {"user": "root", "group": "root", "mode": 600}}
    out, noops = commands(monkeypatch, facts, path="/etc/specdeploy/s.hf-token",
                          secret=secrets.Secret(token))  # fmt: skip
    assert out == [] and noops == ["/etc/specdeploy/s.hf-token is up to date (same sha1, "
                                   "root:root 0600)"]  # fmt: skip


def test_token_file_rotated_or_loose_is_written_or_fixed(monkeypatch):
    facts = {"Sha1File": "0" * 40, "File": {"user": "root", "group": "root", "mode": 600}}
    out, _ = commands(monkeypatch, facts, path="/t", secret=secrets.Secret("new"))
    assert len(out) == 1 and "new" not in repr(out[0])  # a FunctionCommand, value not shown
    facts = {"Sha1File": secrets.written_sha1("tok"), "File": {"user": "deploy", "mode": 644}}
    out, _ = commands(monkeypatch, facts, path="/t", secret=secrets.Secret("tok"))
    assert [str(c) for c in out] == ["chown root:root /t && chmod 600 /t"]


def test_no_token_and_no_file_is_a_noop(monkeypatch):
    out, noops = commands(monkeypatch, {"Sha1File": None}, path="/t", secret=None)
    assert out == [] and noops == ["/t is absent"]
    assert secrets.as_written("a\n") == "a\n" and secrets.as_written("") == "\n"


# --- a changed request set is measured --------------------------------------------------------


def request_set(tmp_path, name, n):
    path = tmp_path / name
    path.write_text("".join(json.dumps({"prompt": f"p{i} " * 5}) + "\n" for i in range(n)))
    return str(path)


def recorded_from(cfg):
    """The workload part of a record written for `cfg` (steps/record.py's layout)."""
    w = cfg.workload
    described = dataset.datasets.describe(w.dataset_path, w.dataset)
    fields = {f: getattr(w, f) for f in dataset.WORKLOAD_FIELDS}
    return SimpleNamespace(workload=RecordedWorkload(**fields, request_set=described))


def test_a_new_request_set_or_rate_is_a_workload_change(valid_data, tmp_path):
    old = request_set(tmp_path, "old.jsonl", 20)
    valid_data["workload"].update({"dataset": "custom", "dataset_path": old})
    cfg = config_from_data(valid_data)
    previous = recorded_from(cfg)
    assert dataset.workload_changes(previous, cfg) == []
    assert dataset.workload_changes(None, cfg) == []  # no record: the unit step decides
    valid_data["workload"]["dataset_path"] = request_set(tmp_path, "new.jsonl", 24)
    assert dataset.workload_changes(previous, config_from_data(valid_data)) == [
        "dataset_path",
        "request_set sha256",
    ]
    # same path, new content: the sha256 alone tells
    valid_data["workload"]["dataset_path"] = old
    request_set(tmp_path, "old.jsonl", 21)
    assert dataset.workload_changes(previous, config_from_data(valid_data)) == [
        "request_set sha256"
    ]
    request_set(tmp_path, "old.jsonl", 20)
    valid_data["workload"]["request_rate"] = 3.0
    assert dataset.workload_changes(previous, config_from_data(valid_data)) == ["request_rate"]
    # the sampling the benchmarks send is part of what was measured
    valid_data["workload"].update({"request_rate": cfg.workload.request_rate, "temperature": 0.7})
    assert dataset.workload_changes(previous, config_from_data(valid_data)) == ["temperature"]


# --- the unit change is applied by the rolling restart, not planned --------------------------


def test_unit_change_applies_only_what_differs(monkeypatch, valid_data):
    from specdeploy.steps import unit as unit_step

    done = []
    swapped = {"value": False}
    monkeypatch.setattr(
        unit_step,
        "lifecycle",
        SimpleNamespace(
            swap_in_staged=lambda cfg, name: done.append("swap") or swapped["value"],
            enable=lambda name: done.append("enable"),
        ),
    )
    monkeypatch.setattr(unit_step, "write_text", lambda path, text, mode: done.append(path))
    cfg = config_from_data(valid_data)
    rendered = RenderedUnit(
        name="u.service", text="", argv=[], role="speculative", path="/etc/systemd/system/u.service"
    )
    stage = SimpleNamespace(did_change=lambda: False)
    same = unit_step.UnitChange(cfg, rendered, False, False, stage_op=stage)
    assert not same.pending() and same.apply() is False and not same.changed()
    assert done == ["swap", "enable"]  # the env file is not rewritten
    done.clear()
    swapped["value"] = True
    env = unit_step.UnitChange(cfg, rendered, True, True, stage_op=stage)
    assert env.pending() and env.apply() is True and env.changed()
    assert done == [cfg.env_file, "swap", "enable"]


# --- the lock's lease: parsing and the takeover decision, from recorded lock lines -------------

HOST_NOW = lock.parse_time("2026-12-01T17:00:00Z")


@pytest.mark.parametrize(
    "line, here, alive, reason",
    [
        # another control host, lease expired: taken over, from anywhere
        ("holder=alice@elsewhere:4242 since=2026-12-01T15:00:00Z host=h1 "
         "expires=2026-12-01T16:30:00Z", "ctl", True, "its lease expired at 2026-12-01T16:30:00Z"),
        # another control host, lease still running: refused
        ("holder=alice@elsewhere:4242 since=2026-12-01T16:50:00Z host=h1 "
         "expires=2026-12-01T17:20:00Z", "ctl", True, None),
        # a line of a release before leases (no expires): only the old rule
        ("holder=alice@elsewhere:4242 since=2020-01-01T00:00:00Z", "ctl", True, None),
        # this control node (its name and machine), process gone: taken over whatever the lease
        ("holder=root@ctl:999999/c0ffee/1 since=x expires=2030-01-01T00:00:00Z", "ctl", False,
         "that process is no longer running on this control host"),
        # this control node, process running: kept even with an expired lease (it renews)
        ("holder=root@ctl:77/c0ffee/1 since=x expires=2020-01-01T00:00:00Z", "ctl", True, None),
        # another control node of this name (another machine): its lease alone counts
        ("holder=root@ctl:999999/beef/1 since=x expires=2030-01-01T00:00:00Z", "ctl", False,
         None),
        ("holder=root@ctl:77/beef/1 since=x expires=2020-01-01T00:00:00Z", "ctl", True,
         "its lease expired at 2020-01-01T00:00:00Z"),
        # a line of an older specdeploy names no machine: it may be another node of this name,
        # so neither a pid gone here nor one running here decides, its lease does
        ("holder=root@ctl:999999 since=x expires=2030-01-01T00:00:00Z", "ctl", False, None),
        ("holder=root@ctl:77 since=x expires=2020-01-01T00:00:00Z", "ctl", True,
         "its lease expired at 2020-01-01T00:00:00Z"),
        # an expiry that is not a time is no lease
        ("holder=alice@elsewhere:1 since=x expires=soon", "ctl", True, None),
    ],
)  # fmt: skip
def test_takeover_decision_from_recorded_lock_lines(line, here, alive, reason):
    fields = lock.parse_holder(line)
    found = lock.takeover_reason(
        fields, HOST_NOW, here=here, machine="c0ffee", running=lambda pid, started: alive
    )
    assert (found is None) == (reason is None)
    if reason:
        assert found.startswith(reason)


def test_held_lock_answer_carries_the_line_and_the_hosts_clock():
    answer = (
        "holder=alice@elsewhere:4242 since=2026-12-01T15:00:00Z host=h1 "
        "expires=2026-12-01T16:30:00Z\nSPECDEPLOY-HOST-NOW: 2026-12-01T17:00:00Z\n"
    )
    line, now = lock.split_answer(answer)
    fields = lock.parse_holder(line)
    assert now == HOST_NOW and fields["who"] == "alice@elsewhere" and fields["pid"] == 4242
    assert lock.describe(fields) == (
        "alice@elsewhere (pid 4242, since 2026-12-01T15:00:00Z, lease until 2026-12-01T16:30:00Z)"
    )


def test_lease_defaults_to_a_server_start_plus_the_smoke(valid_data):
    cfg = config_from_data(valid_data)
    expected = cfg.health_timeout_s + bench.bench_time_limit(cfg) + lock.LEASE_GRACE_S
    assert lock.lease_seconds(cfg) == expected
    assert lock.step_lease(cfg, 10 * expected) == 10 * expected + lock.LEASE_GRACE_S
    assert lock.lease_seconds(config_from_data({**valid_data, "lock_lease_s": 600})) == 600


@pytest.mark.skipif(os.geteuid() != 0, reason="install -o root needs root")
def test_lease_is_written_renewed_and_lost_for_real(tmp_path):
    parent = tmp_path / "run"
    path = str(parent / "locks" / "svc.deploy.lock")
    line = "holder=me@ctl:1 since=2026-12-01T17:00:00Z host=h1"
    assert sh(lock.acquire_command(path, line, lease_s=60, parent=str(parent))) == lock.ACQUIRED
    first = lock.parse_holder(open(path).read())
    assert lock.parse_time(first["expires"]) is not None
    seen, now = lock.split_answer(sh(lock.acquire_command(path, "holder=you@x:2", lease_s=60,
                                                          parent=str(parent))))  # fmt: skip
    assert seen == open(path).read().strip() and now < lock.parse_time(first["expires"])
    assert sh(lock.renew_command(path, "me@ctl:1", line, 3600)) == lock.RENEWED
    renewed = lock.parse_holder(open(path).read())
    assert renewed["since"] == first["since"] and renewed["expires"] > first["expires"]
    assert os.listdir(parent / "locks") == ["svc.deploy.lock"]  # the renewal's file renamed over
    # taken over meanwhile: the renewal says by whom and writes nothing
    other = "holder=alice@elsewhere:4242 since=x host=h1 expires=2030-01-01T00:00:00Z"
    open(path, "w").write(other + "\n")
    assert sh(lock.renew_command(path, "me@ctl:1", line, 3600)) == other
    # a stale lock is removed only while it is still the line judged stale
    sh(lock.remove_if_unchanged_command(path, "holder=alice@elsewhere:4242 since=older"))
    assert os.path.exists(path)
    sh(lock.remove_if_unchanged_command(path, other))
    assert not os.path.exists(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_lock_directory_someone_else_made_is_refused_not_taken_back(tmp_path):
    parent = tmp_path / "run"
    (parent / "locks").mkdir(parents=True)
    os.chmod(parent / "locks", 0o755)
    os.chown(parent / "locks", 65534, 65534)  # nobody: an unprivileged user planted it
    path = str(parent / "locks" / "svc.deploy.lock")
    out = sh(lock.acquire_command(path, "holder=me@ctl:1", lease_s=60, parent=str(parent)))
    assert out.startswith(lock.REFUSED) and "not root:700" in out, out
    assert not os.path.exists(path)  # nothing written in it
    assert (parent / "locks").stat().st_uid == 65534  # nor taken back silently
