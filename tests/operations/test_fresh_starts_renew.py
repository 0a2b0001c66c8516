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

# (fixture, fresh starts it makes): the gate's one measuring loop (sampling/gate_plans.measure_gate)
# at one load (3 runs per arm: also the first host of a class, whose power-derived runs the step
# hands it, gate/speculation_gate_class_canary_measures.json) and across load (9 visits); and the
# step's own start of the unit it ends on (the across-load fall-back's baseline)
CASES = {
    "plain gate": ("gate_plans/measure_gate_measures_pass.json", 6),
    "too few runs": ("gate_plans/measure_gate_too_few_runs.json", 4),
    "across load": ("gate_plans/measure_gate_across_load_falls_back.json", 9),
    "the fall-back's start": ("gate/speculation_gate_across_load_falls_back.json", 1),
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
