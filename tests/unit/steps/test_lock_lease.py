"""A host that waits for its turn keeps its deploy lock (issue 37): in a serial run of hundreds of
hosts the last turn comes days after the locks were taken, far past any lease; every renewal this
process makes also renews, through their own connections, the other hosts' locks whose lease is
half spent. Real pyinfra State and Hosts; the host commands answer from a table."""

from __future__ import annotations

import logging
import os
import shlex

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_host, ctx_state

from specdeploy.steps import lock

PATH = "/run/specdeploy/locks/specdeploy-vllm.deploy.lock"


@pytest.fixture
def fleet(monkeypatch):
    """Three hosts of one run whose locks this process holds; `answers[host]` is what a renewal
    there prints (RENEWED, or the line of whoever took it over); `ran` every (host, command)."""
    before = ctx_host.get(), ctx_state.get()
    state = State(Inventory((["h1", "h2", "h3"], {})), Config())
    for h in state.inventory:
        state.activate_host(h)
    ran: list[tuple[str, str]] = []
    answers = {"h1": "RENEWED\n", "h2": "RENEWED\n", "h3": "RENEWED\n"}

    def sh(command, **_):
        ran.append((lock.host.name, command))
        return answers[lock.host.name] if "RENEWED" in command else ""

    monkeypatch.setattr(lock, "sh", sh)
    monkeypatch.setattr(lock, "holder_id", lambda: "ops@ctl:4242")
    monkeypatch.setattr(
        lock, "_HELD", {n: {PATH: f"holder=ops@ctl:4242 host={n}"} for n in answers}
    )
    monkeypatch.setattr(lock, "_LOST", {})
    now = lock.time.monotonic()
    # h2 was given 1000 s 600 s ago (400 left: due), h3 1000 s 100 s ago (900 left: not due)
    monkeypatch.setattr(lock, "_LEASES", {("h1", PATH): (now + 300, 1000),
                                          ("h2", PATH): (now + 400, 1000),
                                          ("h3", PATH): (now + 900, 1000)})  # fmt: skip
    ctx_state.set(state)
    yield state, ran, answers
    ctx_host.set(before[0]), ctx_state.set(before[1])


def renewed_on(ran):
    return [name for name, command in ran if "RENEWED" in command]


def test_a_turn_renews_its_own_lock_and_the_waiting_hosts_whose_lease_is_half_spent(fleet):
    state, ran, _ = fleet
    ctx_host.set(state.inventory.get_host("h1"))
    lock.renew_held(2000)
    assert renewed_on(ran) == ["h1", "h2"]  # h3 has 900 of its 1000 s left: not yet
    assert " + 2000 " in ran[0][1] and " + 1000 " in ran[1][1]  # h2 keeps its own lease length
    deadline, seconds = lock._LEASES["h2", PATH]
    assert seconds == 1000 and deadline > lock.time.monotonic() + 990
    assert lock.leases_due() == []  # nothing due until h2 or h3 have spent half again


def test_a_waiting_hosts_lock_that_was_taken_over_stops_that_host_at_its_own_turn(fleet, caplog):
    state, ran, answers = fleet
    answers["h2"] = "holder=other@ctl2:7 since=2026-12-04T10:00:00Z host=h2\n"
    ctx_host.set(state.inventory.get_host("h1"))
    with caplog.at_level(logging.WARNING):
        lock.renew_held(2000)  # h1's turn goes on: h2's loss is h2's
    assert "deploy lock lease not renewed" in caplog.text and "other@ctl2" in caplog.text
    assert PATH not in lock._HELD["h2"]
    ctx_host.set(state.inventory.get_host("h2"))
    with pytest.raises(lock.LockLost, match="now held by other@ctl2"):
        lock.renew_held(2000)  # h2's turn: nothing is changed there


def test_a_released_lock_is_never_renewed_again(fleet):
    state, ran, _ = fleet
    ctx_host.set(state.inventory.get_host("h2"))
    lock.release_path(PATH)  # h2's turn ended
    ctx_host.set(state.inventory.get_host("h1"))
    lock.renew_held(2000)
    assert renewed_on(ran) == ["h1"]


def test_an_unreachable_waiting_host_is_warned_about_and_the_turn_goes_on(fleet, caplog):
    state, ran, answers = fleet
    answers["h2"] = None  # a connection that fails: the fake raises on the missing answer
    original = lock.sh

    def sh(command, **kw):
        if lock.host.name == "h2":
            raise OSError("h2: connection reset")
        return original(command, **kw)

    lock.sh = sh  # monkeypatch restores the fixture's fake afterwards
    ctx_host.set(state.inventory.get_host("h1"))
    with caplog.at_level(logging.WARNING):
        assert lock.renew_waiting() == []
    assert "connection reset" in caplog.text
    assert PATH in lock._HELD["h2"]  # still ours: its own turn renews (or stops) it


def test_the_deploy_keeps_the_hosts_ssh_connection_alive(monkeypatch):
    """A real paramiko Transport on pyinfra's SSH connector gets the keepalive (host data
    `ssh_keepalive_s`, default 30 s); 0 leaves it off; a host without SSH is left alone."""
    import socket

    import paramiko

    from specdeploy.config.schema import config_from_data
    from specdeploy.host import on_host
    from tests.unit.conftest import VALID

    before = ctx_host.get(), ctx_state.get()
    state = State(Inventory((["@local", "h1"], {})), Config())
    ssh_host = state.inventory.get_host("h1")
    ours, theirs = socket.socketpair()
    transport = paramiko.Transport(ours)
    client = paramiko.SSHClient()
    client._transport = transport  # what SSHClient.connect leaves behind
    ssh_host.connector.client = client
    try:
        ctx_host.set(ssh_host)
        assert on_host.keep_alive(0) is False
        assert transport.packetizer._Packetizer__keepalive_interval == 0
        cfg = config_from_data(VALID)
        assert cfg.ssh_keepalive_s == 30
        assert on_host.keep_alive(cfg.ssh_keepalive_s) is True
        assert transport.packetizer._Packetizer__keepalive_interval == 30
        ctx_host.set(state.inventory.get_host("@local"))
        assert on_host.keep_alive(30) is False
    finally:
        transport.close(), theirs.close()
        ctx_host.set(before[0]), ctx_state.set(before[1])


# --- who holds a lock (issue 48, case 11) -------------------------------------------------------

MINE, OTHER = "0123456789abcdef", "fedcba9876543210"  # machine keys: this control node, another


class OsAs:
    """The os module as a process of this pid sees it."""

    def __init__(self, pid: int):
        self.getpid = lambda: pid

    def __getattr__(self, name):
        return getattr(os, name)


@pytest.fixture
def ctl(monkeypatch, valid_data):
    """This process is ops@ctl:4242 on machine MINE, started at tick 5150; `pids` are the
    processes running here (pid -> start); `answers` what the host prints to each acquire, in
    order (the lock's line and the host's clock, then ACQUIRED); `ran` every command."""
    from specdeploy.config.schema import config_from_data

    before = ctx_host.get(), ctx_state.get()
    state = State(Inventory((["h1"], {})), Config())
    ctx_state.set(state), ctx_host.set(state.inventory.get_host("h1"))
    pids = {4242: "5150"}
    answers: list[str] = []
    ran: list[str] = []

    def sh_status(command, **_):
        ran.append(command)
        return True, answers.pop(0) if answers else "", None

    def sh(command, **_):
        ran.append(command)
        return "RENEWED\n" if "RENEWED" in command else ""

    monkeypatch.setattr(lock, "sh_status", sh_status)
    monkeypatch.setattr(lock, "sh", sh)
    monkeypatch.setattr(lock, "control_host", lambda: "ctl")
    monkeypatch.setattr(lock, "getpass", type("G", (), {"getuser": staticmethod(lambda: "ops")}))
    monkeypatch.setattr(lock, "os", OsAs(4242))
    monkeypatch.setattr(lock, "pid_alive", lambda pid: pid in pids)
    # raising=False: these exist only since the holder names its machine and start
    monkeypatch.setattr(lock, "machine_key", lambda: MINE, raising=False)
    monkeypatch.setattr(lock, "own_start", lambda: pids[4242], raising=False)
    monkeypatch.setattr(lock, "process_start", lambda pid="self": pids.get(pid), raising=False)
    monkeypatch.setattr(lock, "_HELD", {})
    monkeypatch.setattr(lock, "_LEASES", {})
    monkeypatch.setattr(lock, "_LOST", {})
    yield config_from_data(valid_data), pids, answers, ran
    ctx_host.set(before[0]), ctx_state.set(before[1])


def held_by(holder: str) -> str:
    return (
        f"holder={holder} since=2026-12-01T16:50:00Z host=h1 expires=2026-12-01T17:40:00Z\n"
        "SPECDEPLOY-HOST-NOW: 2026-12-01T17:00:00Z\n"
    )


def test_the_holder_names_its_control_node_and_when_its_process_started(ctl):
    cfg, _, answers, ran = ctl
    assert lock.holder_id() == f"ops@ctl:4242/{MINE}/5150"
    answers.append("ACQUIRED\n")
    assert lock.try_acquire(cfg) is None
    assert f"holder=ops@ctl:4242/{MINE}/5150 since=" in ran[0]
    fields = lock.parse_holder(f"holder=ops@ctl:4242/{MINE}/5150 since=x host=h1")
    assert (fields["who"], fields["pid"], fields["controlhost"]) == ("ops@ctl", 4242, "ctl")
    assert (fields["machine"], fields["started"]) == (MINE, "5150")
    assert lock.describe(fields) == f"ops@ctl (pid 4242, control node {MINE}, since x)"


def test_a_live_lock_of_another_control_node_of_the_same_name_is_not_taken_over(ctl):
    """Two control nodes named ctl: the other's pid 77 does not run here, which says nothing
    about it; its lease runs, so its lock holds."""
    cfg, _, answers, ran = ctl
    answers += [held_by(f"alice@ctl:77/{OTHER}/9"), "ACQUIRED\n"]
    fields = lock.try_acquire(cfg)
    assert fields is not None and fields["pid"] == 77 and len(ran) == 1  # nothing removed
    assert lock._HELD == {}


def test_an_old_format_line_is_foreign_even_with_this_processs_name(ctl):
    """A line of an older specdeploy, `ops@ctl:4242`: this process's user, host name and pid,
    but it may be another control node's (or an earlier process with the pid): not re-entered,
    and while its lease runs it holds."""
    cfg, _, answers, ran = ctl
    answers += [held_by("ops@ctl:4242"), "ACQUIRED\n"]
    fields = lock.try_acquire(cfg)
    assert fields is not None and fields["holder"] == "ops@ctl:4242" and len(ran) == 1
    assert lock._HELD == {}
    # its pid dead here: still judged by its lease only (the same name may be another node)
    answers[:] = [held_by("ops@ctl:999"), "ACQUIRED\n"]
    assert lock.try_acquire(cfg) is not None
    expired = held_by("ops@ctl:999").replace("17:40", "16:55")
    answers[:] = [expired, "ACQUIRED\n"]
    assert lock.try_acquire(cfg) is None  # its lease ran out: taken over
    assert lock._HELD["h1"][cfg.lock_path].startswith(f"holder=ops@ctl:4242/{MINE}/5150 ")


def test_a_reused_pid_is_not_the_holder(ctl):
    """This node's lock of pid 999, started at tick 111: pid 999 runs now, but started at 222 (the
    kernel gave it to another process): the holder is gone, its lock taken over at once."""
    cfg, pids, answers, ran = ctl
    pids[999] = "222"
    answers += [held_by(f"ops@ctl:999/{MINE}/111"), "ACQUIRED\n"]
    assert lock.try_acquire(cfg) is None
    assert "rm -f" in ran[1] and f"ops@ctl:999/{MINE}/111" in ran[1]
    pids[999] = "111"  # the holder itself: kept whatever its lease says
    answers[:] = [held_by(f"ops@ctl:999/{MINE}/111").replace("17:40", "16:55"), "ACQUIRED\n"]
    assert lock.try_acquire(cfg)["pid"] == 999


def test_a_lock_found_already_ours_is_renewed_and_released_like_one_taken(ctl):
    """The re-entrant path: the host already holds this process's line. It is registered as a
    fresh acquisition is: the next renewal rewrites it (its line, a new expiry), a failure hook
    finds it."""
    cfg, _, answers, ran = ctl
    line = f"holder={lock.holder_id()} since=2026-12-01T16:50:00Z host=h1"
    answers.append(
        f"{line} expires=2026-12-01T17:40:00Z\nSPECDEPLOY-HOST-NOW: 2026-12-01T17:00:00Z\n"
    )
    assert lock.try_acquire(cfg) is None
    assert lock._HELD == {"h1": {cfg.lock_path: line}}
    deadline, seconds = lock._LEASES["h1", cfg.lock_path]
    assert seconds == lock.lease_seconds(cfg)
    assert 2390 < deadline - lock.time.monotonic() <= 2400  # 40 min left by the host's clock
    lock.renew_held(3600)
    renewal = [c for c in ran if "RENEWED" in c]
    assert len(renewal) == 1 and shlex.quote(line) in renewal[0] and " + 3600 " in renewal[0]


def test_machine_and_start_are_read_from_the_control_node(monkeypatch):
    """The real reads: this process's start is /proc/self/stat's field 22; the machine key is the
    machine id hashed (never the id itself), else the boot id's, else a random one per process;
    without /proc the start is when the module was imported."""
    fields = open("/proc/self/stat").read().rpartition(")")[2].split()
    assert lock.process_start() == fields[19] == lock.process_start(os.getpid())
    assert lock.process_start(2**22 + 7) is None  # above any pid_max: no such process
    key = lock.machine_key()
    assert len(key) == 16 and int(key, 16) >= 0
    machine_id = lock._first_line("/etc/machine-id")
    assert machine_id is None or machine_id not in lock.holder_id()
    assert lock.holder_id().endswith(f":{os.getpid()}/{key}/{lock.own_start()}")

    lines = {"/etc/machine-id": "a" * 32, "/proc/sys/kernel/random/boot_id": "b00t"}
    monkeypatch.setattr(lock, "_first_line", lines.get)
    try:
        lock.machine_key.cache_clear()
        first = lock.machine_key()
        lines["/etc/machine-id"] = "b" * 32
        lock.machine_key.cache_clear()
        assert lock.machine_key() != first  # another machine
        lines["/etc/machine-id"] = None
        lock.machine_key.cache_clear()
        boot = lock.machine_key()
        lock.machine_key.cache_clear()
        assert lock.machine_key() == boot != first  # the boot id: the same all this boot
        lines["/proc/sys/kernel/random/boot_id"] = None
        lock.machine_key.cache_clear()
        alone = lock.machine_key()
        lock.machine_key.cache_clear()
        assert lock.machine_key() != alone  # random: shared with no other process
        lock._start_of.cache_clear()
        assert lock.own_start() == f"t{lock._IMPORTED:.6f}"
    finally:
        monkeypatch.undo()
        lock.machine_key.cache_clear()
        lock._start_of.cache_clear()
    assert lock.machine_key() == key
