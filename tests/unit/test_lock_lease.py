"""A host that waits for its turn keeps its deploy lock (issue 37): in a serial run of hundreds of
hosts the last turn comes days after the locks were taken, far past any lease; every renewal this
process makes also renews, through their own connections, the other hosts' locks whose lease is
half spent. Real pyinfra State and Hosts; the host commands answer from a table."""

from __future__ import annotations

import logging

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
