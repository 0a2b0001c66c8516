"""No fresh server starts in the speculation gate before the deploy lock's lease is renewed (issue
48, case 8): a class canary used to make every one of its fresh starts with no renewal at all, so at
`lock_lease_s` another deploy could take the lock over while the gate rewrote units. The gate's
own operation fixtures run again with this process holding the host's lock; every renewal is
answered RENEWED and counted, and each fresh start (`systemctl start` after `reset-failed`, as
host/server.start_fresh runs it, or the gate fixtures' stand-in for it, {"sampled": "start ..."}:
harness.SampleStandIns) must come after a renewal made since the previous start."""

from __future__ import annotations

import json

import pytest

from tests.operations import harness

LOCK = "/run/specdeploy/locks/specdeploy-vllm.deploy.lock"
HELD = {LOCK: "holder=tester@ctl:4242/c0ffee00c0ffee00/5150 since=2026-12-01T17:00:00Z host=h1"}

# (fixture, fresh starts it makes): the plain gate (3 runs per arm), the first host of a class (its
# power-derived runs), and the gate across load (9 visits, then the fall-back's baseline start)
CASES = {
    "plain gate": ("gate/speculation_gate_measures_pass.json", 6),
    "class canary": ("gate/speculation_gate_class_canary_measures.json", 6),
    "across load": ("gate/speculation_gate_across_load_falls_back.json", 10),
}


def is_renewal(command: str) -> bool:
    return command.startswith('exp="') and "echo RENEWED" in command


def is_fresh_start(command: str) -> bool:
    return command.startswith("systemctl reset-failed ") and "; systemctl start " in command


def is_stand_in_start(call: dict) -> bool:
    return call.get("sampled", "").startswith("start ")


class RenewedShell(harness.Shell):
    """The fixture's host, with every renewal of the held lock answered RENEWED (not from the
    fixture: its own renewals are taken out) and logged beside the fresh starts, in order."""

    events: list[str] = []

    def sh_status(self, command, *, stdin=None, timeout=None):
        text = str(command)
        if is_renewal(text):
            self.events.append("renew")
            return True, "RENEWED", None
        if is_fresh_start(text):
            self.events.append("start")
        return super().sh_status(command, stdin=stdin, timeout=timeout)

    def _next(self, call: dict) -> dict:
        if is_stand_in_start(call):
            self.events.append("start")
        return super()._next(call)


@pytest.mark.parametrize("case", list(CASES))
def test_every_fresh_start_of_the_gate_renews_the_lease_first(case, monkeypatch, tmp_path):
    path, starts = CASES[case]
    data = json.loads((harness.FIXTURES / path).read_text())
    data["held_locks"] = HELD
    data["host"] = [e for e in data["host"] if not is_renewal(e.get("sh", ""))]
    events: list[str] = []
    monkeypatch.setattr(RenewedShell, "events", events)
    monkeypatch.setattr(harness, "Shell", RenewedShell)
    got = harness.run_case(data, monkeypatch, tmp_path)
    assert "exception" not in got, got.get("exception")
    assert events.count("start") == starts, events
    # each start: how many renewals came since the start before it (or since the gate began)
    since, renewed = 0, []
    for event in events:
        if event == "renew":
            since += 1
        else:
            renewed.append(since)
            since = 0
    assert renewed == [1] * starts, f"{case}: renewals before each fresh start: {renewed}"
